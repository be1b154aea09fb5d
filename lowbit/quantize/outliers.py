"""Outlier channels: the ``k`` input channels with the largest activation square-sum (the
diagonal of XᵀX) move to the end of the input, where they stay in INT8."""

from __future__ import annotations

import torch


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
