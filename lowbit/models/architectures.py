"""One description of every decoder architecture lowbit knows, read by the quantizer's adapter
(:mod:`lowbit.models.adapters`) and the tensor-parallel shard plan (:mod:`lowbit.models.shard_plan`),
so adding a model type is one entry in :data:`ARCHITECTURES`.

Paths are inside one decoder layer (``self_attn.q_proj``) except :attr:`Architecture.layers`,
which is inside the causal LM (``model.layers``).
"""

from __future__ import annotations

from dataclasses import dataclass

from lowbit.errors import LowbitError


class UnsupportedArchitectureError(LowbitError, ValueError):
    """The model is not a Llama-like decoder that lowbit knows how to quantize or shard."""


@dataclass(frozen=True)
class Experts:
    """A mixture-of-experts MLP, unfused into one linear pair per expert (:mod:`lowbit.nn.experts`)."""

    experts: str = "mlp.experts.experts"  # the ModuleList of unfused experts
    gate_up: str = "gate_up_proj"  # each expert's input linear, fed by the post-attention norm
    down: str = "down_proj"  # each expert's output linear
    router: str = "mlp.gate.weight"  # float weight whose columns follow the norm's permutation


@dataclass(frozen=True)
class Architecture:
    """Where a decoder keeps its layers, norms and linears, and how tensor parallelism splits it.

    Column-parallel (split by output rows): ``attention`` (by heads) and ``mlp_in`` (by MLP
    rows); row-parallel (split by input columns, outputs summed): ``attention_out`` and
    ``mlp_out``. ``tp_missing``: what tensor parallelism lacks for this model (None: it splits).
    """

    model_type: str
    layers: str = "model.layers"
    input_norm: str = "input_layernorm"
    attention: tuple[str, ...] = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")
    attention_out: str = "self_attn.o_proj"
    post_attention_norm: str = "post_attention_layernorm"
    mlp_in: tuple[str, ...] = ("mlp.gate_proj", "mlp.up_proj")
    mlp_out: str = "mlp.down_proj"
    norm_offset: float = 0.0  # norms compute x̂ · (offset + w) (Gemma: 1)
    experts: Experts | None = None
    tp_missing: str | None = None

    @property
    def is_moe(self) -> bool:
        return self.experts is not None

    def row_parallel(self) -> tuple[str, str]:
        """The row-parallel linears: their input is split across ranks."""
        return self.attention_out, self.mlp_out


ARCHITECTURES: dict[str, Architecture] = {a.model_type: a for a in (
    Architecture("llama"),
    Architecture("mistral"),
    Architecture("qwen2"),
    Architecture("qwen3"),  # per-head q_norm/k_norm act on head_dim: replicated, unaffected by the head split
    Architecture("gemma", norm_offset=1.0),
    Architecture("mixtral", experts=Experts(),
                 tp_missing="it has mixture-of-experts layers and the shard plan splits dense MLPs only"),
)}


def tp_types() -> list[str]:
    """Model types tensor parallelism can split."""
    return [t for t, a in ARCHITECTURES.items() if not a.tp_missing]


def architecture(model_type: str | None) -> Architecture:
    """The description of ``model_type``, or :class:`UnsupportedArchitectureError` naming it."""
    if model_type not in ARCHITECTURES:
        raise UnsupportedArchitectureError(
            f"lowbit supports Llama-like decoders ({', '.join(sorted(ARCHITECTURES))}); got model_type={model_type!r}")
    return ARCHITECTURES[model_type]
