"""Error measures of a quantized tensor against its original."""

from __future__ import annotations

import math

import torch


def sqnr_db(x: torch.Tensor, x_hat: torch.Tensor) -> float:
    """Signal-to-quantization-noise ratio, 10·log10(Σx² / Σ(x − x̂)²), in dB (inf if exact)."""
    x64, e = x.double(), (x.double() - x_hat.double())
    noise = float((e * e).sum())
    signal = float((x64 * x64).sum())
    if noise == 0.0:
        return math.inf
    if signal == 0.0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)


def power_sums(x: torch.Tensor, x_hat: torch.Tensor) -> tuple[float, float]:
    """(Σx², Σ(x − x̂)²) in float64, to pool SQNR over many tensors."""
    x64 = x.double()
    e = x64 - x_hat.double()
    return float((x64 * x64).sum()), float((e * e).sum())
