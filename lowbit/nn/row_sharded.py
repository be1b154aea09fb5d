"""A linear layer cut along its input into the slices that tensor-parallel ranks hold.

Each part is an independent :class:`~lowbit.nn.QuantLinear` over one contiguous input slice,
with its own outlier permutation, groups and INT8 outlier scale, so a rank can quantize its
activations from its own channels alone. In one process the parts' outputs are summed here;
under tensor parallelism each rank keeps one part and the sum is the all-reduce. The bias is
added once, after the sum.
"""

from __future__ import annotations

import torch
from torch import nn


class RowShardedLinear(nn.Module):
    def __init__(self, parts: list[nn.Module], splits: list[int], out_features: int, bias: torch.Tensor | None):
        super().__init__()
        if len(parts) != len(splits) or not splits or min(splits) < 1:
            raise ValueError(f"need one part per non-empty slice, got {len(parts)} parts for slices {splits}")
        self.parts = nn.ModuleList(parts)
        self.splits = [int(s) for s in splits]
        self.in_features, self.out_features = sum(self.splits), out_features
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())

    @classmethod
    def empty(cls, splits: list[int], out_features: int, has_bias: bool) -> "RowShardedLinear":
        """Placeholder parts (filled in by the checkpoint loader)."""
        return cls([nn.Identity() for _ in splits], splits, out_features, torch.zeros(out_features) if has_bias else None)

    def layout(self) -> dict:
        return {"splits": self.splits, "out_features": self.out_features, "has_bias": self.bias is not None}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"input has {x.shape[-1]} features, the layer expects {self.in_features}")
        y = None
        for part, xs in zip(self.parts, x.split(self.splits, dim=-1)):
            ys = part(xs).float()
            y = ys if y is None else y + ys
        if self.bias is not None:
            y = y + self.bias
        return y.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.in_features}->{self.out_features}, slices={self.splits}"
