"""Input validation shared by every format: one clear error instead of a silent wrong number."""

from __future__ import annotations

import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def check_bits(bits: int, lo: int = 2, hi: int = 8) -> int:
    if isinstance(bits, bool) or not isinstance(bits, int) or not lo <= bits <= hi:
        raise ValueError(f"bits must be an integer in {lo}..{hi}, got {bits!r}")
    return bits


def check_float_input(x: torch.Tensor, what: str = "input") -> None:
    """Reject non-float dtypes and NaN/Inf.

    NaN or Inf would poison the scale of its whole block (and, per tensor, everything), so
    the formats refuse them up front; the all-reduce codecs have their own per-block policy.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{what} must be float32, float16 or bfloat16, got {x.dtype}")
    # One cheap reduction first: a finite sum proves every element finite; only an Inf/NaN sum
    # (or a sum that overflowed) needs the element-wise look.
    if x.numel() and not bool(torch.isfinite(x.sum(dtype=torch.float64))) and not bool(torch.isfinite(x).all()):
        bad = int((~torch.isfinite(x)).sum())
        raise ValueError(f"{what} contains {bad} NaN/Inf value(s); quantization needs finite values")
