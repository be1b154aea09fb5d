"""One description of every decoder architecture lowbit knows, read by the quantizer's adapter
(:mod:`lowbit.models.adapters`), the tensor-parallel shard plan and shards
(:mod:`lowbit.models.shard_plan`, :mod:`lowbit.parallel`) and the rotation pre-pass, so adding a
model type is one entry in :data:`ARCHITECTURES` plus its tests.

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
    """A mixture-of-experts MLP, unfused into one linear pair per expert (:mod:`lowbit.nn.experts`).
    Layers without ``experts`` (Qwen3-MoE's ``mlp_only_layers``) are dense MLPs."""

    experts: str = "mlp.experts.experts"  # the ModuleList of unfused experts
    gate_up: str = "gate_up_proj"  # each expert's input linear, fed by the MLP norm
    down: str = "down_proj"  # each expert's output linear
    router: str = "mlp.gate.weight"  # float weight whose columns follow the norm's permutation
    # how a Hugging Face checkpoint stores them (read by a tensor-parallel rank): expert e's gate,
    # up and down weights are ``{stored}.{e}.{name}.weight``, the router ``stored_router``
    stored: str = "mlp.experts"
    stored_parts: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")
    stored_router: str = "mlp.gate.weight"

    @property
    def parent(self) -> str:
        """The module that holds the experts (``mlp.experts``), called with the routed tokens."""
        return self.experts.rpartition(".")[0]

    def gate_ups(self, n: int) -> list[str]:
        return [f"{self.experts}.{e}.{self.gate_up}" for e in range(n)]

    def downs(self, n: int) -> list[str]:
        return [f"{self.experts}.{e}.{self.down}" for e in range(n)]


@dataclass(frozen=True)
class Architecture:
    """Where a decoder keeps its layers, norms and linears, and how tensor parallelism splits it.

    ``input_norm`` feeds ``attention``, ``mlp_norm`` feeds ``mlp_in``: the outlier permutation
    and SmoothQuant's scales fold into them. None: the linears read the raw residual stream (OLMo 2
    normalises block *outputs*), so each linear permutes its own input and nothing is smoothed.
    One path in ``attention`` / ``mlp_in`` is a fused projection (Phi-3: rows q|k|v, gate|up),
    quantized as one linear. Column-parallel (split by output rows): ``attention`` (by heads) and
    ``mlp_in`` (by MLP rows); row-parallel (split by input columns, outputs summed):
    ``attention_out`` and ``mlp_out``; in an MoE layer every expert's gate/up (by its MLP rows)
    and down (by the same columns), the router replicated, the experts' partial sum all-reduced once.
    ``whole_qk_norms``: norms over the whole projected q and k (all heads together, OLMo 2),
    split with their projections' rows, their sums of squares summed across ranks.
    ``final_norm``: the norm whose output the LM head reads (its calibration inputs).
    ``tp_missing`` / ``rotation_missing``: what tensor
    parallelism / the rotation pre-pass lacks for this model (None: supported).
    """

    model_type: str
    layers: str = "model.layers"
    input_norm: str | None = "input_layernorm"
    attention: tuple[str, ...] = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")
    attention_out: str = "self_attn.o_proj"
    mlp_norm: str | None = "post_attention_layernorm"
    mlp_in: tuple[str, ...] = ("mlp.gate_proj", "mlp.up_proj")
    mlp_out: str = "mlp.down_proj"
    norm_offset: float = 0.0  # norms compute x̂ · (offset + w) (Gemma: 1)
    experts: Experts | None = None
    whole_qk_norms: tuple[str, str] | None = None
    tp_missing: str | None = None
    rotation_missing: str | None = None
    final_norm: str = "model.norm"  # the norm between the last layer and the LM head

    @property
    def is_moe(self) -> bool:
        return self.experts is not None

    @property
    def fused_attention(self) -> bool:
        """One linear computes q, k and v (rows q heads | k heads | v heads)."""
        return len(self.attention) == 1

    @property
    def fused_mlp(self) -> bool:
        """One linear computes gate and up (rows gate | up)."""
        return len(self.mlp_in) == 1

    def row_parallel(self) -> tuple[str, str]:
        """The row-parallel linears: their input is split across ranks."""
        return self.attention_out, self.mlp_out


_POST_NORMS = ("it normalises the attention and MLP outputs before the residual add, and a rotated "
               "residual stream does not commute with those norms' per-channel scales")
_GEMMA = dict(mlp_norm="pre_feedforward_layernorm", norm_offset=1.0, rotation_missing=_POST_NORMS)

ARCHITECTURES: dict[str, Architecture] = {a.model_type: a for a in (
    Architecture("llama"),  # Llama 1-3.x: rope scaling is the rotary module's business, not the layout's
    Architecture("mistral"),
    Architecture("qwen2"),
    Architecture("qwen3"),  # per-head q_norm/k_norm act on head_dim: replicated, unaffected by the head split
    Architecture("gemma", norm_offset=1.0),
    Architecture("gemma2", **_GEMMA),  # sliding/global layers, soft-capping: inside attention, untouched
    Architecture("gemma3_text", **_GEMMA),  # + per-head q/k norms
    Architecture("phi3", attention=("self_attn.qkv_proj",), mlp_in=("mlp.gate_up_proj",),
                 rotation_missing="its fused qkv_proj has no separate v_proj rows for the per-head rotation"),
    Architecture("olmo2", input_norm=None, mlp_norm=None, whole_qk_norms=("self_attn.q_norm", "self_attn.k_norm"),
                 rotation_missing=_POST_NORMS),
    Architecture("mixtral", experts=Experts(stored="block_sparse_moe.experts", stored_parts=("w1", "w3", "w2"),
                                            stored_router="block_sparse_moe.gate.weight")),
    Architecture("qwen3_moe", experts=Experts()),
)}


def tp_types() -> list[str]:
    """Model types tensor parallelism can split."""
    return [t for t, a in ARCHITECTURES.items() if not a.tp_missing]


def architecture(model_type: str | None) -> Architecture:
    """The description of ``model_type``, or :class:`UnsupportedArchitectureError` naming it."""
    if model_type not in ARCHITECTURES:
        raise UnsupportedArchitectureError(
            f"lowbit supports Llama-like decoders ({', '.join(sorted(ARCHITECTURES))}); got model_type={model_type!r}: "
            "its layers, norms and linears are not described in lowbit.models.architectures")
    return ARCHITECTURES[model_type]
