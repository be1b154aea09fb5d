"""Reordering the last dimension (Atom's channel reorder, applied after a norm or before a linear).

``torch.gather`` over a stride-0 view of the permutation gives ``x.index_select(-1, perm)``'s
values (a copy: the same bits) 2.5-5x faster on CPU at prefill sizes: measured on an AMX Xeon,
[8, 64, 1536] float32 0.76 ms against 3.5 ms, where index_select along the last dimension took 40 %
of a W4A4 prefill of the default model.
"""

from __future__ import annotations

import torch


def permute_channels(x: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """``x[..., perm]`` for an int64 ``perm`` of ``x``'s last size (an index outside it is an error)."""
    if x.dim() == 0 or perm.dim() != 1 or perm.shape[0] != x.shape[-1]:
        raise ValueError(f"channel permutation of {tuple(perm.shape)} for an input of {tuple(x.shape)}")
    return torch.gather(x, -1, perm.expand(*x.shape[:-1], perm.shape[0]))
