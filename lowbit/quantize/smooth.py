"""SmoothQuant: divide a norm-fed input's channels by ``s`` and multiply the consumers' weight
columns by ``s`` (exact in float); ``s_j = max|X_j|^α / max|W_j|^(1-α)`` balances the ranges."""

from __future__ import annotations

import torch
from torch import nn

from lowbit.models.module_paths import get_path


def smooth_scales(act_amax: torch.Tensor, weights: list[torch.Tensor], alpha: float) -> torch.Tensor:
    w_amax = torch.stack([w.abs().amax(dim=0) for w in weights]).amax(dim=0).float()
    s = act_amax.float().clamp(min=1e-5).pow(alpha) / w_amax.clamp(min=1e-5).pow(1 - alpha)
    return s.clamp(min=1e-5)


def fold_into_norm(norm_weight: torch.Tensor, s: torch.Tensor, offset: float) -> None:
    """Norm output ``x̂ (offset + w)`` becomes ``x̂ (offset + w) / s``."""
    with torch.no_grad():
        norm_weight.copy_(((offset + norm_weight.float()) / s - offset).to(norm_weight.dtype))


def smooth_group(layer: nn.Module, group, linears: list[nn.Linear], amax: list[torch.Tensor], xtx: list[torch.Tensor],
                 sqsum: torch.Tensor, alpha: float, norm_offset: float) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Fold smoothing scales into a norm-fed group (its norm, its linears, its ``extra`` weights)
    and return the statistics of the smoothed input: ``XᵀX`` and the square-sum divided by ``s``,
    so outliers and GPTQ see the input the quantized model will get."""
    s = smooth_scales(torch.stack(amax).amax(0), [m.weight for m in linears], alpha)
    fold_into_norm(get_path(layer, group.norm).weight, s, norm_offset)
    with torch.no_grad():
        for m in linears:
            m.weight.mul_(s[None, :].to(m.weight.dtype))
        for p in group.extra:
            get_path(layer, p).mul_(s[None, :])
    return [h / s[:, None] / s[None, :] for h in xtx], sqsum / s.pow(2)
