"""A norm whose output channels come out reordered (Atom fuses the reorder into the norm).

RMSNorm's statistic is invariant under a channel permutation, so permuting its *output* is the
same as permuting the residual stream and the norm weight; the consumers (q/k/v, gate/up, a MoE
router) get their weight columns permuted the same way, and the float result is unchanged. A
norm with ``forward_permuted`` (the native RMSNorm) writes the reordered channels in its own pass.
"""

from __future__ import annotations

import torch
from torch import nn

from lowbit.kernels.channel_order import permute_channels


class PermutedNorm(nn.Module):
    def __init__(self, norm: nn.Module, perm: torch.Tensor):
        super().__init__()
        self.norm = norm
        self.register_buffer("perm", perm.clone().long())

    @property
    def weight(self):  # so code that reads ``norm.weight`` keeps working
        return self.norm.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fused = getattr(self.norm, "forward_permuted", None)  # a native norm writes the reorder itself
        y = fused(x, self.perm) if fused is not None else None
        return y if y is not None else permute_channels(self.norm(x), self.perm)
