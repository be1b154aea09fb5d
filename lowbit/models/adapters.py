"""Architecture adapters: where a Llama-like decoder keeps its layers, norms and linears, and
which linears read the same input (so they share one channel permutation).

Supported: Llama, Mistral, Qwen2, Qwen3, Gemma (norm weight used as ``1 + w``) and Mixtral
(experts unfused into one linear pair each, see :mod:`lowbit.nn.experts`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn


class UnsupportedArchitectureError(ValueError):
    """The model is not a Llama-like decoder that lowbit knows how to quantize."""


@dataclass
class InputGroup:
    """Linears (paths inside a decoder layer) that consume one input.

    ``norm``: the norm that produces the input (the permutation is fused into it), or None when
    the input comes from inside a block (o_proj, down_proj): then each linear permutes its own
    input. ``extra``: float weights (e.g. a MoE router) whose columns follow the permutation.
    """

    linears: list[str]
    norm: str | None = None
    extra: list[str] = field(default_factory=list)


DENSE = {"llama", "mistral", "qwen2", "qwen3", "gemma"}
MOE = {"mixtral"}
NORM_OFFSET = {"gemma": 1.0}


@dataclass
class Adapter:
    model_type: str

    @property
    def norm_offset(self) -> float:
        """Norms compute ``x̂ · (offset + w)`` (Gemma: 1)."""
        return NORM_OFFSET.get(self.model_type, 0.0)

    @property
    def is_moe(self) -> bool:
        return self.model_type in MOE

    def layers(self, model: nn.Module) -> nn.ModuleList:
        return model.model.layers

    def prepare(self, model: nn.Module) -> None:
        """Unfuse MoE experts into per-expert linears (same computation)."""
        if not self.is_moe:
            return
        from lowbit.nn.experts import UnfusedExperts

        for layer in self.layers(model):
            if not isinstance(layer.mlp.experts, UnfusedExperts):
                layer.mlp.experts = UnfusedExperts.from_fused(layer.mlp.experts)

    def groups(self, layer: nn.Module) -> list[InputGroup]:
        attn = [InputGroup(["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"], "input_layernorm"),
                InputGroup(["self_attn.o_proj"])]
        if not self.is_moe:
            return attn + [InputGroup(["mlp.gate_proj", "mlp.up_proj"], "post_attention_layernorm"),
                           InputGroup(["mlp.down_proj"])]
        n = len(layer.mlp.experts.experts)
        ups = [f"mlp.experts.experts.{e}.gate_up_proj" for e in range(n)]
        downs = [InputGroup([f"mlp.experts.experts.{e}.down_proj"]) for e in range(n)]
        return attn + [InputGroup(ups, "post_attention_layernorm", extra=["mlp.gate.weight"])] + downs


def check_supported(model_type: str | None) -> None:
    """Raise :class:`UnsupportedArchitectureError` unless lowbit can quantize ``model_type``."""
    if model_type not in DENSE | MOE:
        raise UnsupportedArchitectureError(
            f"lowbit quantize supports Llama-like decoders ({', '.join(sorted(DENSE | MOE))}); got model_type={model_type!r}"
        )


def get_adapter(model: nn.Module) -> Adapter:
    config = getattr(model, "config", None)
    mt = getattr(config, "model_type", None)
    check_supported(mt)
    if not hasattr(model, "model") or not hasattr(model.model, "layers"):
        raise UnsupportedArchitectureError(f"{type(model).__name__} has no model.layers; is it a *ForCausalLM model?")
    return Adapter(mt)


def get_path(root: nn.Module, path: str):
    obj = root
    for part in path.split("."):
        obj = getattr(obj, part) if not part.isdigit() else obj[int(part)]
    return obj


def set_path(root: nn.Module, path: str, value) -> None:
    parent, _, name = path.rpartition(".")
    obj = get_path(root, parent) if parent else root
    if name.isdigit():
        obj[int(name)] = value
    else:
        setattr(obj, name, value)
