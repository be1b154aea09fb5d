"""Granularity as types: which elements share one scale (and zero point).

Every granularity maps a tensor to a 2-D "block view" ``[n_blocks, block_len]``; the
quantization math works on that view only, so each granularity is a few lines here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class PerTensor:
    """One scale for the whole tensor."""

    def name(self) -> str:
        return "tensor"


@dataclass(frozen=True)
class PerChannel:
    """One scale per index of ``axis`` (weights: axis 0 = output channel)."""

    axis: int = 0

    def name(self) -> str:
        return f"channel(axis={self.axis})"


@dataclass(frozen=True)
class PerGroup:
    """One scale per ``group_size`` consecutive values along the last dim.

    A last dim that ``group_size`` does not divide ends in a shorter tail group.
    """

    group_size: int

    def __post_init__(self):
        if not isinstance(self.group_size, int) or self.group_size <= 0:
            raise ValueError(f"group_size must be a positive integer, got {self.group_size!r}")

    def name(self) -> str:
        return f"group{self.group_size}"


@dataclass(frozen=True)
class PerToken:
    """One scale per row of the last dim (activations: per token)."""

    def name(self) -> str:
        return "token"


Granularity = PerTensor | PerChannel | PerGroup | PerToken


@dataclass(frozen=True)
class BlockView:
    """How a tensor was laid out as blocks, so codes can be put back in its shape."""

    shape: tuple[int, ...]
    granularity: Granularity
    pad: int = 0  # zeros appended to the last dim (PerGroup tail)

    @property
    def n_blocks(self) -> int:
        return n_blocks(self.shape, self.granularity)


def n_blocks(shape: tuple[int, ...], g: Granularity) -> int:
    """Number of scales a tensor of ``shape`` needs under granularity ``g``."""
    numel = 1
    for s in shape:
        numel *= s
    if numel == 0:
        return 0
    if isinstance(g, PerTensor):
        return 1
    if isinstance(g, PerChannel):
        return shape[g.axis]
    last = shape[-1] if shape else 1
    rows = numel // last
    if isinstance(g, PerToken):
        return rows
    if isinstance(g, PerGroup):
        return rows * (-(-last // g.group_size))
    raise TypeError(f"unknown granularity {g!r}")


def to_blocks(x: torch.Tensor, g: Granularity) -> tuple[torch.Tensor, BlockView]:
    """Return ``x`` as ``[n_blocks, block_len]`` and the view needed to undo it.

    PerGroup pads a ragged tail with zeros: zeros never raise an absmax and always lie
    inside an asymmetric range (which includes 0), so they do not change the tail's scale.
    """
    shape = tuple(x.shape)
    if x.dim() == 0:
        x = x.reshape(1)
    if isinstance(g, PerTensor):
        return x.reshape(1, -1), BlockView(shape, g)
    if isinstance(g, PerChannel):
        if not -x.dim() <= g.axis < x.dim():
            raise ValueError(f"axis {g.axis} out of range for a {x.dim()}-D tensor")
        return x.movedim(g.axis, 0).reshape(x.shape[g.axis], -1), BlockView(shape, g)
    if isinstance(g, PerToken):
        return x.reshape(-1, x.shape[-1]), BlockView(shape, g)
    if isinstance(g, PerGroup):
        last = x.shape[-1]
        pad = (-last) % g.group_size
        if pad:
            x = F.pad(x, (0, pad))
        return x.reshape(-1, g.group_size), BlockView(shape, g, pad)
    raise TypeError(f"unknown granularity {g!r}")


def from_blocks(blocks: torch.Tensor, view: BlockView) -> torch.Tensor:
    """Inverse of :func:`to_blocks`."""
    shape, g = view.shape, view.granularity
    if isinstance(g, PerChannel):
        moved = list(shape)
        axis = g.axis % max(len(shape), 1)
        c = moved.pop(axis)
        return blocks.reshape([c] + moved).movedim(0, axis)
    if isinstance(g, PerGroup) and view.pad:
        padded_last = shape[-1] + view.pad
        return blocks.reshape(*shape[:-1], padded_last)[..., : shape[-1]]
    return blocks.reshape(shape)
