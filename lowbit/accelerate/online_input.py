"""What a packed linear's input goes through before its kernel: the outlier reorder and an
online transform (:mod:`lowbit.nn.online_hadamard`), in the order the layer was quantized with.

A transform that runs before the reorder (``before_perm``: the R4 Hadamard) leaves the reorder to
the kernel (W4A4's reads x through it in C); one that runs after it (the block Hadamard of the
``-rot`` presets) needs x reordered first, outside the kernel: it is called as ``transform(x,
perm)`` and reads x through the reorder itself (one C pass on CPU).
"""

from __future__ import annotations

import torch
from torch import nn

from lowbit.kernels.channel_order import permute_channels
from lowbit.kernels.linear_params import KernelError


def input_steps(ql: nn.Module, folded: bool = False
                ) -> tuple[torch.Tensor | None, torch.Tensor | None, nn.Module | None]:
    """``(the reorder the kernel reads x through, the reorder applied before the transform, the
    transform)`` of the packed linear ``ql``; ``folded``: the layer before already writes x in
    ``ql``'s input order (:func:`lowbit.accelerate.fuse.down_input_orders`), which a transform
    that runs before the reorder forbids (KernelError)."""
    transform = getattr(ql, "input_transform", None)
    if folded and transform is not None and transform.before_perm:
        raise KernelError("an input order cannot be folded upstream past a transform that runs before it")
    perm = None if ql.input_perm is None or folded else ql.input_perm.clone()
    return (*split_perm(perm, transform), transform)


def split_perm(perm: torch.Tensor | None, transform: nn.Module | None
               ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``(the reorder the kernel applies, the reorder applied before the transform)``: one is None."""
    if perm is not None and (transform is None or transform.before_perm):
        return perm, None
    return None, perm


def same_transform(a: nn.Module | None, b: nn.Module | None) -> bool:
    """Whether two linears' online transforms compute the same function (both none, or equal descriptions)."""
    if a is None or b is None:
        return a is b
    return type(a) is type(b) and a.to_dict() == b.to_dict()


def prepare_input(x: torch.Tensor, perm: torch.Tensor | None, transform: nn.Module | None) -> torch.Tensor:
    """``x`` as the kernel reads it: the transform before or after ``perm`` (the reorder outside the kernel)."""
    if transform is not None and transform.before_perm:
        x = transform(x)
    elif transform is not None:
        return transform(x, perm)  # the block Hadamard gathers as it reads
    if perm is not None:
        x = permute_channels(x, perm)
    return x
