"""The signed-absmax scale rule of full-range symmetric grids, written once.

A full-range symmetric grid ``[-2^(b-1), 2^(b-1)-1]`` puts a block's largest-magnitude value
exactly on the extra negative code: scale = signed_absmax · clip / -2^(b-1) (negative when that
value is positive). Weights, activations, the kernels' token codes and the all-reduce codecs all
use it; they differ only in which value wins a tie of magnitudes and in how the scale is stored:

* ``ties="positive"``: of ``+a`` and ``-a`` the positive one wins (``choose_qparams``, weights);
* ``ties="first"``: the first in the block wins (``argmax`` order: activations, token codes,
  codecs, and the C and Triton kernels that mirror them).

Activations may instead take compressed-tensors' rule (``scale_rule="compressed-tensors"``, what
transformers computes when it runs such a checkpoint): a positive scale ``absmax · clip /
((2^b - 1) / 2)``, so a positive absmax lands on 2^(b-1) and is clamped to 2^(b-1) - 1. Its step is
2^b / (2^b - 1) times coarser and it clips the positive extremes; lowbit's own rule is the default.

:func:`store_scale` casts a float32 scale to its storage dtype without shrinking its magnitude,
so the stored grid still covers the block.
"""

from __future__ import annotations

import torch

TIES = ("positive", "first")
SCALE_RULES = ("signed", "compressed-tensors")


def signed_absmax(blocks: torch.Tensor, ties: str = "first") -> torch.Tensor:
    """The value of largest magnitude of each row of ``blocks [..., L]`` (L > 0), with its sign."""
    if ties == "first":
        idx = blocks.abs().argmax(dim=-1, keepdim=True)
        return blocks.gather(-1, idx).squeeze(-1)
    if ties == "positive":
        hi, lo = blocks.amax(dim=-1), blocks.amin(dim=-1)
        return torch.where(hi >= -lo, hi, lo)
    raise ValueError(f"ties must be one of {TIES}, got {ties!r}")


def symmetric_scale(blocks: torch.Tensor, bits: int, clip: float = 1.0, ties: str = "first") -> torch.Tensor:
    """Unrounded full-range scale per row: ``signed_absmax · clip / -2^(bits-1)`` (0 for a zero row)."""
    return signed_absmax(blocks, ties) * clip / -(2 ** (bits - 1))


def half_range_scale(blocks: torch.Tensor, bits: int, clip: float = 1.0) -> torch.Tensor:
    """compressed-tensors' symmetric scale per row: ``absmax · clip / ((2^bits - 1) / 2)`` (0 for a
    zero row): its ``calculate_qparams``'s float32 division (times 1 is exact when ``clip`` is 1)."""
    return blocks.abs().amax(dim=-1) * clip / ((2**bits - 1) / 2)


def rule_scale(blocks: torch.Tensor, bits: int, clip: float, rule: str, ties: str = "first") -> torch.Tensor:
    """The unrounded scale per row by ``rule`` (one of :data:`SCALE_RULES`)."""
    if rule == "signed":
        return symmetric_scale(blocks, bits, clip, ties)
    if rule == "compressed-tensors":
        return half_range_scale(blocks, bits, clip)
    raise ValueError(f"scale_rule must be one of {SCALE_RULES}, got {rule!r}")


def store_scale(scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``scale`` in ``dtype``, stepped one ulp away from zero where the cast shrank its magnitude.

    NaN and Inf pass through (the caller decides what they mean); zeros stay zero."""
    stored = scale.to(dtype)
    if dtype == scale.dtype:
        return stored
    shrunk = stored.float().abs() < scale.abs()
    away = torch.where(scale < 0, -torch.inf, torch.inf).to(dtype)
    return torch.where(shrunk, torch.nextafter(stored, away), stored)


def nonzero_scale(scale: torch.Tensor) -> torch.Tensor:
    """An all-zero block's scale 0 becomes 1, so it decodes to exact zeros."""
    return torch.where(scale == 0, torch.ones_like(scale), scale)
