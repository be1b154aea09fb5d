"""Bit packing of unsigned codes into uint8, along the last dim, exact round trip.

A b-bit code is split into planes of 4, 2 and 1 bits (b's binary digits, low bits first):
6 bits = a 4-bit plane + a 2-bit plane, 3 bits = a 2-bit plane + a 1-bit plane, 4 bits = two
codes per byte, 2 bits = four per byte, 8 bits = the bytes themselves. Planes never straddle a
byte, so packing and unpacking are shifts and masks that vectorise on any device. Within a byte
the first code sits in the lowest bits. The planes are laid one after another.
"""

from __future__ import annotations

import torch

from .checks import check_bits

_INT_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def planes(bits: int) -> list[int]:
    """Plane widths of a b-bit code, low bits first (8 is one whole-byte plane)."""
    check_bits(bits, 1, 8)
    if bits == 8:
        return [8]
    return [w for w in (4, 2, 1) if bits & w]


def packed_size(n: int, bits: int) -> int:
    """Bytes that ``n`` codes of ``bits`` take (each plane padded to whole bytes)."""
    return sum(-(-n // (8 // w)) for w in planes(bits))


def pack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack unsigned codes in ``[0, 2^bits)`` along the last dim into uint8."""
    if codes.dtype not in _INT_DTYPES:
        raise TypeError(f"codes must be an integer tensor, got {codes.dtype}")
    check_bits(bits, 1, 8)
    if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= 2**bits):
        raise ValueError(
            f"codes out of range for {bits}-bit packing: min {int(codes.min())}, max {int(codes.max())}, "
            f"allowed 0..{2**bits - 1}"
        )
    c = codes.to(torch.uint8)
    if c.dim() == 0:
        c = c.reshape(1)
    n = c.shape[-1]
    out, shift = [], 0
    for w in planes(bits):
        per = 8 // w
        v = (c >> shift) & ((1 << w) - 1)
        pad = (-n) % per
        if pad:
            v = torch.nn.functional.pad(v, (0, pad))
        v = v.reshape(*v.shape[:-1], v.shape[-1] // per, per)
        byte = torch.zeros(v.shape[:-1], dtype=torch.uint8, device=c.device)
        for j in range(per):
            byte |= v[..., j] << (j * w)
        out.append(byte)
        shift += w
    return out[0] if len(out) == 1 else torch.cat(out, dim=-1)


def unpack(packed: torch.Tensor, bits: int, n: int) -> torch.Tensor:
    """Inverse of :func:`pack`: ``n`` uint8 codes per row."""
    if packed.dtype != torch.uint8:
        raise TypeError(f"packed data must be uint8, got {packed.dtype}")
    need = packed_size(n, bits)
    if packed.shape[-1] != need:
        raise ValueError(f"{n} codes of {bits} bits take {need} bytes per row, got {packed.shape[-1]}")
    codes = torch.zeros(*packed.shape[:-1], n, dtype=torch.uint8, device=packed.device)
    start, shift = 0, 0
    for w in planes(bits):
        per = 8 // w
        nb = -(-n // per)
        plane = packed[..., start : start + nb]
        parts = [(plane >> (j * w)) & ((1 << w) - 1) for j in range(per)]
        vals = torch.stack(parts, dim=-1).reshape(*plane.shape[:-1], nb * per)[..., :n]
        codes |= vals << shift
        start += nb
        shift += w
    return codes
