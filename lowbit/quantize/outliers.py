"""Outlier channels: the ``k`` input channels with the largest activation square-sum (the
diagonal of XᵀX) move to the end of the input, where they stay in INT8."""

from __future__ import annotations

import torch
from torch import nn

from lowbit.models.module_paths import get_path, set_path
from lowbit.nn.permuted_norm import PermutedNorm


def outlier_permutation(sqsum: torch.Tensor, k: int) -> torch.Tensor:
    """Normal channels in their original order, then the top-k channels by ascending square-sum."""
    n = sqsum.numel()
    if not 0 <= k <= n:
        raise ValueError(f"outlier count {k} must be in [0, {n}]")
    top = torch.topk(sqsum.float(), k).indices if k else sqsum.new_zeros(0, dtype=torch.long)
    top = top[torch.argsort(sqsum[top].float())]
    mask = torch.ones(n, dtype=torch.bool, device=sqsum.device)
    mask[top] = False
    return torch.cat([torch.arange(n, device=sqsum.device)[mask], top]).long()


def permute_group_input(layer: nn.Module, group, perm: torch.Tensor) -> torch.Tensor | None:
    """Put ``perm`` into the graph for one input group. A norm-fed group permutes once, in its
    norm (a :class:`PermutedNorm`; ``extra`` weights' columns follow): returns None. A group fed
    from inside a block has no norm to carry it: returns ``perm`` for each linear to apply."""
    if group.norm is None:
        return perm
    set_path(layer, group.norm, PermutedNorm(get_path(layer, group.norm), perm))
    with torch.no_grad():
        for p in group.extra:
            w = get_path(layer, p)
            w.copy_(w[:, perm])
    return None
