"""Run under TRITON_INTERPRET=1 (test_triton_codec.py starts it): the Triton codecs against the
reference on CPU tensors; prints one JSON line {case: true/false}."""

import json

import torch

from lowbit.comm.codecs import decode_ref, encode_ref, get_codec, reduce_encode
from lowbit.comm.codecs import triton as tc
from lowbit.comm.codecs.spec import fp_wire_dtype


def inputs(dtype: torch.dtype, n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * torch.rand(n, generator=g).pow(4) * 50
    x[:64] = 0.0  # all-zero blocks
    x[64:96] = torch.linspace(-3, 3, 32)  # a +m/-m tie
    x[100] = float("nan")  # a poisoned block
    x[130] = float("inf")
    x[200:232] = 1e-30  # a scale below fp16's subnormals
    if dtype != torch.float16:
        x[300] = 3e7  # beyond the fp16 scale range: extended scales
        x[340], x[345] = -2e38, 2e38  # tie at the top of the range
    return x.to(dtype)


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bits, NaN payloads aside (a NaN where the other has NaN)."""
    na, nb = torch.isnan(a), torch.isnan(b)
    bits = a.view(torch.uint8).view(-1, a.element_size()) == b.view(torch.uint8).view(-1, b.element_size())
    return bool(torch.equal(na, nb) and bits.all(dim=1)[~na].all())


def main() -> None:
    out = {}
    for codec in tc.SUPPORTED:
        c = get_codec(codec)
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            for n in (5000,):  # two whole rows and a partial one
                x = inputs(dtype, n, n + c.bits)
                key = f"{codec}_{str(dtype)[6:]}_{n}"
                w = tc.encode(x, c)
                out[f"encode_{key}"] = bool(torch.equal(w, encode_ref(x, c)))
                for od in (torch.float32, dtype):
                    ref = decode_ref(w, c, n, od)
                    got = tc.decode(w, c, n, od)
                    out[f"decode_{key}_{str(od)[6:]}"] = same(got, ref) and bool(torch.isnan(ref).any())
                ws = [encode_ref(inputs(dtype, n, n + j), c) for j in range(3)]
                clamp = 2.0**17 if dtype == torch.float16 else 0.0
                ref = reduce_encode(ws, c, fp_wire=fp_wire_dtype(dtype), clamp=clamp, fused=False)
                out[f"reduce_{key}"] = bool(torch.equal(tc.reduce_encode(ws, c, clamp=clamp), ref))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
