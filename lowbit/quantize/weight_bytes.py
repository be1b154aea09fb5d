"""Bytes that a model's decoder-layer weights take, float against packed."""

from __future__ import annotations

from torch import nn

from lowbit.models.adapters import get_adapter
from lowbit.nn.quant_linear import module_bytes


def decoder_bytes(model: nn.Module) -> int:
    """Parameters and buffers of all decoder layers (linears, norms, permutations)."""
    return sum(module_bytes(layer) for layer in get_adapter(model).layers(model))
