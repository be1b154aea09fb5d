"""Run under TRITON_INTERPRET=1 (by test_triton_interpret.py): Triton kernels vs the references
on small shapes; prints one JSON object of named results."""

import json

import torch

from lowbit.kernels import ActSpec, from_float, quantize_tokens, reference
from lowbit.kernels.triton.act_codes import quantize_tokens_triton
from lowbit.kernels.cpu.hadamard import block_hadamard_reference, input_hadamard_reference
from lowbit.kernels.triton.hadamard import block_hadamard_triton, input_hadamard_triton
from lowbit.kernels.triton.w4a4 import prepare, run


def main() -> None:
    res = {}
    torch.manual_seed(0)
    for name, (t, out, n_in, k, group) in {"k32": (5, 40, 288, 32, 128), "k0_m17": (17, 70, 256, 0, 128),
                                           "g64_odd": (3, 24, 199, 8, 64)}.items():
        x = torch.randn(t, n_in) * 2
        x[0] = 0.0
        perm = torch.randperm(n_in)
        act = ActSpec(4, group, 0.9)
        a, b = quantize_tokens(x[:, perm], act, k), quantize_tokens_triton(x, act, k, perm)
        res[f"act_{name}"] = all(torch.equal(u, v) for u, v in ((a.codes, b.codes), (a.scale, b.scale),
                                                                 (a.outlier, b.outlier), (a.outlier_scale, b.outlier_scale)))
        p = from_float(torch.randn(out, n_in), "w4a4", group=group, n_outliers=k, act_clip=0.9, bias=torch.randn(out))
        y = run(x, prepare(p))
        y64, mag = reference.integer_reference(x, p)
        ng = p.scale.shape[1]
        res[f"gemm_{name}"] = bool(torch.all((y.double() - y64).abs() <= (ng + 3) * 2.0 ** -24 * mag + 1e-12))
        res[f"gemm_{name}_maxrel"] = float(((y.double() - y64).abs() / mag.clamp_min(1e-30)).max())
    x8 = torch.randn(4, 64)
    a8, r8 = quantize_tokens_triton(x8, ActSpec(8, 0)), quantize_tokens(x8, ActSpec(8, 0))
    res["act_int8_row"] = torch.equal(a8.codes, r8.codes) and torch.equal(a8.scale, r8.scale)
    x8[1, 7], x8[2, 9] = 40.0, -40.0  # a positive absmax: compressed-tensors' rule clamps it to 127
    for name, act in {"int8_row": ActSpec(8, 0, 1.0, "compressed-tensors"),
                      "int4_g64": ActSpec(4, 64, 0.9, "compressed-tensors")}.items():
        a, r = quantize_tokens_triton(x8, act), quantize_tokens(x8, act)
        res[f"act_ct_{name}"] = torch.equal(a.codes, r.codes) and torch.equal(a.scale, r.scale)
    for name, (t, n, normal, block, dt) in {"had_576": (3, 576, 512, 128, torch.float32),
                                             "had_bf16": (2, 1536, 1472, 64, torch.bfloat16),
                                             "had_tiny": (5, 20, 16, 2, torch.float16),
                                             "had_notail": (1, 64, 64, 32, torch.float32)}.items():
        x = (torch.randn(t, n) * torch.rand(n) * 30).to(dt)
        got, want = block_hadamard_triton(x, normal, block), block_hadamard_reference(x, normal, block)
        bits = torch.int16 if dt != torch.float32 else torch.int32
        res[name] = got.dtype == dt and torch.equal(got.view(bits), want.view(bits))
    for name, (t, n, dt) in {"in_1536": (3, 1536, torch.float32), "in_576_bf16": (2, 576, torch.bfloat16),
                             "in_12_fp16": (5, 12, torch.float16), "in_64": (1, 64, torch.float32),
                             "in_20": (2, 20, torch.float32)}.items():
        x = (torch.randn(t, n) * torch.rand(n) * 30).to(dt)
        x[0, 1] = -0.0
        got, want = input_hadamard_triton(x), input_hadamard_reference(x)
        bits = torch.int16 if dt != torch.float32 else torch.int32
        res[name] = got.dtype == dt and torch.equal(got.view(bits), want.view(bits))
    print(json.dumps(res))


if __name__ == "__main__":
    main()
