"""SmoothQuant: divide a norm-fed input's channels by ``s`` and multiply the consumers' weight
columns by ``s`` (exact in float); ``s_j = max|X_j|^α / max|W_j|^(1-α)`` balances the ranges."""

from __future__ import annotations

import torch


def smooth_scales(act_amax: torch.Tensor, weights: list[torch.Tensor], alpha: float) -> torch.Tensor:
    w_amax = torch.stack([w.abs().amax(dim=0) for w in weights]).amax(dim=0).float()
    s = act_amax.float().clamp(min=1e-5).pow(alpha) / w_amax.clamp(min=1e-5).pow(1 - alpha)
    return s.clamp(min=1e-5)


def fold_into_norm(norm_weight: torch.Tensor, s: torch.Tensor, offset: float) -> None:
    """Norm output ``x̂ (offset + w)`` becomes ``x̂ (offset + w) / s``."""
    with torch.no_grad():
        norm_weight.copy_(((offset + norm_weight.float()) / s - offset).to(norm_weight.dtype))
