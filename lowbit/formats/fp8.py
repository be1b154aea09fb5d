"""FP8 E4M3 / E5M2 through torch's float8 dtypes, with a float32 scale per tensor or channel."""

from __future__ import annotations

import torch

from .checks import check_float_input
from .granularity import Granularity, PerTensor, from_blocks, to_blocks

FP8_DTYPES = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def fp8_max(kind: str) -> float:
    return float(torch.finfo(FP8_DTYPES[kind]).max)


def fp8_quantize(
    x: torch.Tensor, kind: str = "e4m3", granularity: Granularity = PerTensor()
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (fp8 values in x's shape, float32 scale per block): x ≈ value · scale."""
    check_float_input(x)
    if kind not in FP8_DTYPES:
        raise ValueError(f"kind must be one of {sorted(FP8_DTYPES)}, got {kind!r}")
    blocks, view = to_blocks(x.float(), granularity)
    amax = blocks.abs().amax(dim=1) if blocks.numel() else blocks.new_zeros(blocks.shape[0])
    scale = amax / fp8_max(kind)
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    q = (blocks / scale[:, None]).clamp(-fp8_max(kind), fp8_max(kind)).to(FP8_DTYPES[kind])
    return from_blocks(q, view), scale


def fp8_dequantize(
    q: torch.Tensor, scale: torch.Tensor, granularity: Granularity = PerTensor(), dtype=torch.float32
) -> torch.Tensor:
    blocks, view = to_blocks(q.float(), granularity)
    return from_blocks(blocks * scale[:, None], view).to(dtype)
