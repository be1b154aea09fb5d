"""Fast bit packing for whole rows: the same bytes as ``lowbit.formats.pack``, no checks, no padding.

The formats' ``pack`` validates its input (a device sync) and pads odd lengths; the all-reduce
hot path packs rows of exactly 2048 codes that it built itself, so it skips both.
"""

from __future__ import annotations

import torch

from lowbit.formats import planes


def pack_rows(codes: torch.Tensor, bits: int, out: torch.Tensor) -> None:
    """Pack uint8 codes ``[rows, n]`` into ``out[rows, packed]`` (planes low bits first)."""
    rows, n = codes.shape
    start, shift = 0, 0
    for w in planes(bits):
        per = 8 // w
        nb = n // per
        v = codes if w == bits else (codes >> shift) & ((1 << w) - 1)  # one plane: codes as they are
        dst = out[:, start : start + nb]
        if per == 1:
            dst.copy_(v)
        else:
            v = v.reshape(rows, nb, per)
            acc = v[..., 0] | (v[..., 1] << w)
            for j in range(2, per):
                acc |= v[..., j] << (j * w)
            dst.copy_(acc)
        start += nb
        shift += w


def unpack_rows(packed: torch.Tensor, bits: int, n: int) -> torch.Tensor:
    """Inverse of :func:`pack_rows`: uint8 codes ``[rows, n]``."""
    rows = packed.shape[0]
    out = None
    start, shift = 0, 0
    for w in planes(bits):
        per = 8 // w
        nb = n // per
        plane = packed[:, start : start + nb]
        if per == 1:
            vals = plane
        else:
            mask = (1 << w) - 1
            vals = torch.stack([(plane >> (j * w)) & mask for j in range(per)], dim=-1).reshape(rows, n)
        out = vals if out is None else out | (vals << shift)
        start += nb
        shift += w
    assert out is not None
    return out
