"""What a quantized model's module tree looks like, as JSON: which linears are packed (and
their layouts), which norms emit permuted channels, whether MoE experts were unfused. Enough
to rebuild empty modules before loading the tensors, without the float weights."""

from __future__ import annotations

import torch
from torch import nn

from lowbit.models.adapters import get_adapter, get_path, set_path
from lowbit.nn.experts import UnfusedExperts
from lowbit.nn.permuted_norm import PermutedNorm
from lowbit.nn.quant_linear import QuantLinear, QuantLinearLayout
from lowbit.nn.row_sharded import RowShardedLinear


def describe(model: nn.Module) -> dict:
    return {
        "quant_linears": {n: m.layout.to_dict() for n, m in model.named_modules() if isinstance(m, QuantLinear)},
        "permuted_norms": [n for n, m in model.named_modules() if isinstance(m, PermutedNorm)],
        "unfused_experts": any(isinstance(m, UnfusedExperts) for m in model.modules()),
        "row_sharded": {n: m.layout() for n, m in model.named_modules() if isinstance(m, RowShardedLinear)},
    }


def rebuild(model: nn.Module, layout: dict) -> None:
    """Give a freshly built float model the module tree ``layout`` describes (tensors empty)."""
    if layout.get("unfused_experts"):
        get_adapter(model).prepare(model)
    for name in layout.get("permuted_norms", []):
        norm = get_path(model, name)
        set_path(model, name, PermutedNorm(norm, torch.arange(norm.weight.shape[0])))
    for name, d in layout.get("row_sharded", {}).items():
        get_path(model, name)
        set_path(model, name, RowShardedLinear.empty(d["splits"], d["out_features"], d["has_bias"]))
    for name, d in layout.get("quant_linears", {}).items():
        get_path(model, name)  # raises AttributeError for a layout that does not fit the model
        set_path(model, name, QuantLinear(QuantLinearLayout.from_dict(d)))
