"""Codes packed into int32 words the way compressed-tensors packs them (``pack_to_int32``): each
word holds ``32 // bits`` unsigned codes, code i in bits ``[i*bits, (i+1)*bits)``, rows padded
with zero codes to whole words; ``dim=0`` packs along rows instead (zero points)."""

from __future__ import annotations

import sys

import torch


def pack_int32(codes: torch.Tensor, bits: int, dim: int = 1) -> torch.Tensor:
    """Unsigned codes ``[rows, cols]`` (values < 2**bits) as int32 words along ``dim``."""
    if not 1 <= bits <= 8:
        raise ValueError(f"bits must be 1..8, got {bits}")
    if dim == 0:
        return pack_int32(codes.t(), bits).t().contiguous()
    per = 32 // bits
    if 8 % bits == 0 and sys.byteorder == "little":  # whole codes per byte: build bytes, view as words
        v = torch.nn.functional.pad(codes.to(torch.uint8), (0, (-codes.shape[1]) % per))
        v = v.reshape(v.shape[0], -1, 8 // bits)
        byte = v[..., 0].clone()
        for i in range(1, 8 // bits):
            byte |= v[..., i] << (i * bits)
        return byte.contiguous().view(torch.int32)
    v = codes.to(torch.int64)
    rows, cols = v.shape
    v = torch.nn.functional.pad(v, (0, (-cols) % per)).reshape(rows, -1, per)
    words = (v << (torch.arange(per, dtype=torch.int64) * bits)).sum(-1)
    return torch.where(words >= 2 ** 31, words - 2 ** 32, words).to(torch.int32).contiguous()


def unpack_int32(words: torch.Tensor, bits: int, n: int, dim: int = 1) -> torch.Tensor:
    """Inverse of :func:`pack_int32`: ``n`` uint8 codes per row (``dim=1``) or per column (``dim=0``)."""
    if words.dtype != torch.int32:
        raise TypeError(f"packed words must be int32, got {words.dtype}")
    if not 1 <= bits <= 8:
        raise ValueError(f"bits must be 1..8, got {bits}")
    w = words.to(torch.int64) & 0xFFFFFFFF
    if dim == 0:
        w = w.t()
    per = 32 // bits
    if w.shape[1] * per < n:
        raise ValueError(f"{w.shape[1]} words of {per} codes cannot hold {n} codes")
    shifts = torch.arange(per, dtype=torch.int64) * bits
    codes = ((w[:, :, None] >> shifts) & (2 ** bits - 1)).reshape(w.shape[0], -1)[:, :n].to(torch.uint8)
    return codes.t().contiguous() if dim == 0 else codes.contiguous()
