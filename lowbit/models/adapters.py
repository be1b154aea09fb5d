"""Architecture adapters: the quantizer's view of a decoder described in
:mod:`lowbit.models.architectures`: its layers, and which linears read the same input (so they
share one channel permutation). MoE experts are unfused into one linear pair each
(:mod:`lowbit.nn.experts`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn

from .architectures import Architecture, UnsupportedArchitectureError, architecture
from .module_paths import get_path, set_path

__all__ = ["Adapter", "InputGroup", "UnsupportedArchitectureError", "check_supported", "get_adapter"]


@dataclass
class InputGroup:
    """Linears (paths inside a decoder layer) that consume one input.

    ``norm``: the norm that produces the input (the permutation is fused into it), or None when
    no norm produces it (o_proj, down_proj; OLMo 2's q/k/v): then each linear permutes its own
    input. ``extra``: float weights (e.g. a MoE router) whose columns follow the permutation.
    ``shared``: every forward calls the linears with one tensor (q/k/v, gate/up: one activation
    quantization, one statistics accumulator), not so for MoE experts, which each see their own
    tokens. ``stage``: the group's place in the layer's forward (0 attention in, 1 attention out,
    2 MLP in, 3 MLP out), where true-sequential calibration cuts.
    """

    linears: list[str]
    norm: str | None = None
    extra: list[str] = field(default_factory=list)
    shared: bool = False
    stage: int = 0


@dataclass
class Adapter:
    arch: Architecture

    @property
    def model_type(self) -> str:
        return self.arch.model_type

    @property
    def norm_offset(self) -> float:
        """Norms compute ``x̂ · (offset + w)`` (Gemma: 1)."""
        return self.arch.norm_offset

    @property
    def is_moe(self) -> bool:
        return self.arch.is_moe

    def layers(self, model: nn.Module) -> nn.ModuleList:
        return get_path(model, self.arch.layers)

    def has_experts(self, layer: nn.Module) -> bool:
        """Whether this decoder layer's MLP is a mixture of experts (Qwen3-MoE mixes in dense ones)."""
        if not self.is_moe:
            return False
        try:
            mod = get_path(layer, self.arch.experts.parent)
        except (AttributeError, IndexError):
            return False
        return hasattr(mod, "gate_up_proj") or hasattr(mod, "experts")

    def prepare(self, model: nn.Module) -> None:
        """Unfuse MoE experts into per-expert linears (same computation)."""
        if not self.is_moe:
            return
        from lowbit.nn.experts import UnfusedExperts

        parent = self.arch.experts.parent
        for layer in self.layers(model):
            if not self.has_experts(layer):
                continue
            fused = get_path(layer, parent)
            if not isinstance(fused, UnfusedExperts):
                set_path(layer, parent, UnfusedExperts.from_fused(fused))

    def groups(self, layer: nn.Module) -> list[InputGroup]:
        a = self.arch
        attn = [InputGroup(list(a.attention), a.input_norm, shared=True, stage=0),
                InputGroup([a.attention_out], stage=1)]
        if not self.has_experts(layer):
            return attn + [InputGroup(list(a.mlp_in), a.mlp_norm, shared=True, stage=2),
                           InputGroup([a.mlp_out], stage=3)]
        ex = a.experts
        n = len(get_path(layer, ex.experts))
        downs = [InputGroup([d], stage=3) for d in ex.downs(n)]
        return attn + [InputGroup(ex.gate_ups(n), a.mlp_norm, extra=[ex.router], stage=2)] + downs


def check_supported(model_type: str | None) -> None:
    """Raise :class:`UnsupportedArchitectureError` unless lowbit can quantize ``model_type``."""
    architecture(model_type)


def get_adapter(model: nn.Module) -> Adapter:
    config = getattr(model, "config", None)
    arch = architecture(getattr(config, "model_type", None))
    try:
        get_path(model, arch.layers)
    except (AttributeError, IndexError):
        raise UnsupportedArchitectureError(
            f"{type(model).__name__} has no {arch.layers}; is it a *ForCausalLM model?") from None
    return Adapter(arch)
