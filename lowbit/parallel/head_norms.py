"""Norms over a whole projected q or k (OLMo 2's q_norm/k_norm: one RMS over all heads together),
split with the heads: each rank keeps its heads' weights and scales by the global RMS, whose sum
of squares is one small plain all-reduce of ``[tokens, 1]`` per norm. The statistic is summed
exactly (never a quantized codec, whatever the row-parallel layers use), and a KV head that
several ranks hold (replicated or expanded) is counted by one of them only.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

from lowbit.models.architectures import Architecture
from lowbit.models.module_paths import get_path, set_path
from lowbit.models.shard_plan import Ranges, TPPlan, column_rows, owned_kv


class ShardedHeadNorm(nn.Module):
    """``w_local · x / sqrt(sum over all ranks of x² / width + eps)`` (the RMSNorm of the
    whole projection, in float32 as transformers' RMSNorm computes it); ``counted``: which local
    heads enter the sum of squares (None: all)."""

    def __init__(self, weight: torch.Tensor, eps: float, width: int, head_dim: int, counted: list[bool] | None,
                 reduce: Callable[[torch.Tensor], torch.Tensor]):
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.variance_epsilon, self.width, self.head_dim = eps, width, head_dim
        mask = None if counted is None or all(counted) else torch.tensor(counted, dtype=torch.float32)
        self.register_buffer("counted", mask, persistent=False)
        self.reduce = reduce

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        sq = x.pow(2)
        if self.counted is not None:
            sq = (sq.unflatten(-1, (-1, self.head_dim)) * self.counted[:, None]).flatten(-2)
        total = self.reduce(sq.sum(-1, keepdim=True).contiguous())
        return (self.weight * (x * torch.rsqrt(total / self.width + self.variance_epsilon))).to(dtype)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)} of {self.width}, eps={self.variance_epsilon}"


def _plain_sum(t: torch.Tensor) -> torch.Tensor:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t)
    return t


def shard_whole_qk_norms(layer: nn.Module, arch: Architecture, plan: TPPlan, rank: int,
                         read_rows: Callable[[str, Ranges], torch.Tensor]) -> None:
    """Replace the layer's whole-projection q and k norms by this rank's :class:`ShardedHeadNorm`;
    ``read_rows(path inside the layer, ranges)`` reads the rows of a stored weight."""
    if arch.whole_qk_norms is None:
        return
    rows = column_rows(plan, rank)
    hd = plan.head_dim
    for norm, proj, width, counted in zip(arch.whole_qk_norms, arch.attention[:2], (plan.n_heads * hd, plan.n_kv * hd),
                                          (None, owned_kv(plan, rank))):
        eps = get_path(layer, norm).variance_epsilon
        set_path(layer, norm, ShardedHeadNorm(read_rows(norm + ".weight", rows[proj]), eps, width, hd, counted, _plain_sum))
