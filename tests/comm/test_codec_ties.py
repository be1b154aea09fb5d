"""A block whose largest magnitude occurs as both +a and -a: the reference codec picks the scale
by the same rule as the fast and C codecs (the first of the two, ``formats.absmax``), so their
bytes agree; before, the reference took the positive one and disagreed with them."""

import pytest
import torch

from lowbit.comm.codecs import fast, reference


@pytest.mark.parametrize("codec", ["int4", "int6", "int8", "fp4"])
@pytest.mark.parametrize("first", [-1.0, 1.0])
def test_tied_absmax_same_bytes(codec, first):
    x = torch.randn(2 * 2048, generator=torch.Generator().manual_seed(5)) * 0.1
    x[0], x[5] = first, -first  # block 0: a tie of magnitudes
    x[2048 + 40], x[2048 + 33] = 2.0, -2.0  # another block: the negative one first
    ref = reference.encode_ref(x, codec)
    assert torch.equal(fast.encode_torch(x, codec), ref)
    assert torch.equal(fast.encode(x, codec), ref)
    assert torch.equal(reference.decode_ref(ref, codec, x.numel(), torch.float32),
                       fast.decode(ref, codec, x.numel(), torch.float32))



def _near_half_rows(qmin: int, dtype) -> torch.Tensor:
    """Blocks whose values sit at or next to half-integers of x / s where a product by fl(1 / s)
    rounds to another integer than the divide does (the C encoders multiply, and divide only near
    half-integers): float32 values a few ulps from (k + 0.5) * s, bfloat16 values exactly on them.
    Each block starts with +|qmin| * s, which fixes its scale at -s (exact in fp16)."""
    g = torch.Generator().manual_seed(qmin)
    blocks, found = [], 0
    for s in (torch.rand(4000, generator=g) * 2 + 1e-3).to(dtype).half().float():
        amax = abs(qmin) * s
        if amax.to(dtype).float() != amax:
            continue
        half = (torch.arange(qmin, -qmin).float() + 0.5) * s
        if dtype == torch.float32:
            x = half.repeat(4) + torch.randint(-6, 7, (half.numel() * 4,), generator=g) * torch.finfo(torch.float32).eps * half.repeat(4).abs()
        else:
            x = half[half.to(dtype).float() == half]
        x = x[((x * (1.0 / -s)).round() != (x / -s).round()) & (x.abs() < amax)]
        for i in range(0, x.numel(), 31):
            blk = torch.cat([amax.view(1), x[i:i + 31]])
            blocks.append(torch.nn.functional.pad(blk, (0, 32 - blk.numel())))
        found += x.numel()
        if found >= 200:
            break
    assert found >= 20  # the data does hold values where a plain product would round otherwise
    rows = torch.stack(blocks)
    rows = torch.cat([rows, torch.zeros(-rows.shape[0] % 64, 32)]).view(-1)
    return rows.to(dtype)


@pytest.mark.parametrize("codec,qmin", [("int3", -4), ("int4", -8), ("int6", -32), ("int8", -128)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_codes_next_to_half_integers_match_the_divide(codec, qmin, dtype):
    x = _near_half_rows(qmin, dtype)
    ref = fast.encode_torch(x, codec)
    assert torch.equal(fast.encode(x, codec), ref)
    assert torch.equal(reference.encode_ref(x[:2048], codec), ref[:1])
