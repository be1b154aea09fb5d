"""What a quantized model's module tree looks like, as JSON: which linears are packed (and
their layouts), which norms emit permuted channels, whether MoE experts were unfused. Enough
to rebuild empty modules before loading the tensors, without the float weights."""

from __future__ import annotations

import torch
from torch import nn

from lowbit.models.adapters import get_adapter
from lowbit.models.module_paths import get_path, set_path
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


LAYOUT_KEYS = ("quant_linears", "permuted_norms", "unfused_experts", "row_sharded")


def check_layout(layout: dict, scheme) -> None:
    """Raise ValueError where ``layout`` is not what ``scheme`` makes: unknown keys, packed
    linears with other bits / format / symmetry / activation bits than the scheme records."""
    if not isinstance(layout, dict):
        raise ValueError(f"layout must be an object, got {type(layout).__name__}")
    unknown = sorted(set(layout) - set(LAYOUT_KEYS))
    if unknown:
        raise ValueError(f"unknown layout key(s) {unknown}; known: {list(LAYOUT_KEYS)}")
    linears = layout.get("quant_linears", {})
    for name, d in linears.items():
        head = name.split(".")[-1] == "lm_head"
        args = scheme.lm_head if head else scheme.weights
        want = {"w_bits": args.bits}
        if args.enabled:
            want.update(w_format=args.format, w_symmetric=args.symmetric)
        got = {k: d.get(k) for k in want}
        act = d.get("act")
        if act is not None:
            got["act bits"], want["act bits"] = act.get("bits"), None if head else scheme.activations.bits
        if got != want:
            raise ValueError(f"{name} is stored as {got} but the scheme {scheme.name!r} records {want}")
    body = [n for n in linears if n.split(".")[-1] != "lm_head"]
    if (scheme.weights.enabled or scheme.activations.enabled) and not body:
        raise ValueError(f"the scheme {scheme.name!r} quantizes the decoder, but the layout has no packed linears")
