"""The one group view and the one integer dequantize of a group layout, bit for bit against the
formulas the kernels and the reference path held (repeat_interleave scales, padded reshapes)."""

import pytest
import torch

from lowbit.formats.grid import dequantize_groups, expand_groups, from_groups, n_groups, to_groups


@pytest.mark.parametrize("rows,n,group", [(3, 128, 32), (5, 100, 32), (4, 7, 0), (2, 0, 16), (0, 64, 32), (1, 33, 128)])
def test_round_trip_and_padding(rows, n, group):
    x = torch.randn(rows, n)
    blocks = to_groups(x, group)
    g = group or n or 1
    assert blocks.shape == (rows * n_groups(n, group), g)
    assert torch.equal(from_groups(blocks, rows, n), x)
    if n % g:
        assert bool((blocks.reshape(rows, -1)[:, n:] == 0).all())  # the ragged tail is zero padded


def _old_dequantize(codes, scale, zero, group):  # LinearParams.dequantize before
    n = codes.shape[1]
    g = group or n
    q = codes.to(torch.float32)
    if zero is not None:
        q = q - zero.float().repeat_interleave(g, dim=1)[:, :n]
    return q * scale.repeat_interleave(g, dim=1)[:, :n]


@pytest.mark.parametrize("n,group", [(128, 32), (100, 32), (96, 0), (5, 4)])
def test_dequantize_groups_equals_the_old_formula(n, group):
    gen = torch.Generator().manual_seed(n + group)
    out, ng = 6, n_groups(n, group)
    scale = torch.randn(out, ng, generator=gen).half().float()
    signed = torch.randint(-8, 8, (out, n), generator=gen).to(torch.int8)
    assert torch.equal(dequantize_groups(signed, scale, None, group), _old_dequantize(signed, scale, None, group))
    unsigned = torch.randint(0, 16, (out, n), generator=gen).to(torch.uint8)
    zero = torch.randint(0, 16, (out, ng), generator=gen).to(torch.int32)
    assert torch.equal(dequantize_groups(unsigned, scale, zero, group), _old_dequantize(unsigned, scale, zero, group))
    assert torch.equal(expand_groups(scale, group, n), scale.repeat_interleave(group or n, dim=1)[:, :n])


def test_dequantize_groups_of_no_columns():
    assert dequantize_groups(torch.zeros(3, 0, dtype=torch.int8), torch.zeros(3, 0), None, 0).shape == (3, 0)


def test_grid_signed_codes_equal_the_old_offset_formula():
    from lowbit.formats.grid import Grid

    for bits in (3, 4, 8):
        grid = Grid(bits, True, "int")
        codes = torch.arange(2 ** bits).to(torch.uint8)
        assert torch.equal(grid.signed(codes), (codes.to(torch.int16) - 2 ** (bits - 1)).to(torch.int8))
        assert grid.signed(codes).tolist() == list(range(-(2 ** (bits - 1)), 2 ** (bits - 1)))
