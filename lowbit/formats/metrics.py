"""Error measures of a quantized tensor against its original."""

from __future__ import annotations

import math

import torch


def power_sums(x: torch.Tensor, x_hat: torch.Tensor) -> tuple[float, float]:
    """(Σx², Σ(x − x̂)²), accumulated in float64, to pool SQNR over many tensors."""
    xf = x.float()
    e = xf - x_hat.float()
    return float(xf.square().sum(dtype=torch.float64)), float(e.square().sum(dtype=torch.float64))


def sqnr_db(x: torch.Tensor, x_hat: torch.Tensor) -> float:
    """Signal-to-quantization-noise ratio, 10·log10(Σx² / Σ(x − x̂)²), in dB (inf if exact)."""
    signal, noise = power_sums(x, x_hat)
    if noise == 0.0:
        return math.inf
    if signal == 0.0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)
