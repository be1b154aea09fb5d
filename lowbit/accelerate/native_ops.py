"""``use_native_ops(model)``: a Hugging Face model's RMSNorms, rotary embedding and one-token
(decode) attention run as single native calls (:mod:`.decode_ops`) instead of chains of small
PyTorch operators; over lowbit's packed KV cache a decode step attends straight from the codes
(``PackedKVLayer.attend_one``) instead of dequantizing the whole cache every step.

Why: at batch 1 a decode step of the default model spends more time in these small operators
(and in CPU bf16 attention, which is emulated without bf16 arithmetic) than in its 4-bit linears.
They are the same for every weight format, so ``lowbit bench decode`` gives them to every format,
the float baselines included, and the ratios between formats measure the linears alone.

Only what is known to match is swapped: norms of the classes in :data:`NORM_CLASSES` (Llama's
formula; Gemma's ``1 + w`` norm is not among them), Llama's own attention class for the rotary
embedding, and the attention function only where the model used ``sdpa``. The attention falls back to ``sdpa`` for everything but one query token per sequence
with no mask and no extras (softcap, position bias, sinks), so prefill is unchanged.
"""

from __future__ import annotations

from collections import Counter

import torch
from torch import nn
from transformers.integrations import sdpa_attention
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaAttention, apply_rotary_pos_emb, eager_attention_forward

from lowbit.kernels.cpu.decode_ops import attention_decode, rms_norm, rms_norm_reference, rope

NORM_CLASSES = ("LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm", "MixtralRMSNorm")
ATTENTION = "lowbit_native"
# keyword arguments that change the attention's math: with any of them set, sdpa runs
_EXTRAS = ("softcap", "position_bias", "s_aux", "sinks")


class NativeRMSNorm(nn.Module):
    """Llama's RMSNorm in one native call; the same ``weight`` parameter (so the same state dict)."""

    def __init__(self, norm: nn.Module):
        super().__init__()
        self.weight = norm.weight
        self.variance_epsilon = float(norm.variance_epsilon)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = rms_norm(x, self.weight, self.variance_epsilon)
        return y if y is not None else rms_norm_reference(x, self.weight, self.variance_epsilon)

    def forward_permuted(self, x: torch.Tensor, perm: torch.Tensor) -> torch.Tensor | None:
        """``forward(x)[..., perm]`` written in the norm's own pass (a :class:`PermutedNorm`'s
        reorder, which as a separate gather cost as much as the norm); None where the native op
        does not apply."""
        return rms_norm(x, self.weight, self.variance_epsilon, perm=perm)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.variance_epsilon}"


def attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None, **kwargs):
    """Hugging Face attention interface: the native kernel for one query token with no mask, sdpa
    otherwise (same signature and output layout ``[B, q_len, heads, D]``)."""
    if attention_mask is None and not dropout and query.shape[2] == 1 and not any(
            kwargs.get(k) is not None for k in _EXTRAS):
        out = attention_decode(query, key, value, scaling if scaling is not None else query.shape[-1] ** -0.5)
        if out is not None:
            return out, None
    return sdpa_attention.sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                                 scaling=scaling, **kwargs)


class NativeLlamaAttention(LlamaAttention):
    """Llama's attention (same modules, same state dict) whose forward applies the rotary embedding
    with :func:`rope`: the same bits as Hugging Face's ``apply_rotary_pos_emb`` in 2 calls instead
    of about 14. The rest of the forward is Hugging Face's, step for step (tested bit for bit)."""

    def forward(self, hidden_states, position_embeddings=None, attention_mask=None, cache=None, **kwargs):
        if cache is None:
            cache = kwargs.pop("past_key_values", None)
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)
        q = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        k = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        v = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        cos, sin = position_embeddings
        q_rot, k_rot = rope(q, cos, sin), rope(k, cos, sin)
        if q_rot is None or k_rot is None:
            q_rot, k_rot = apply_rotary_pos_emb(q, k, cos, sin)
        if cache is not None and attention_mask is None and q_rot.shape[2] == 1 and not self.training and not any(
                kwargs.get(k) is not None for k in _EXTRAS):
            layer = _packed_layer(cache, self.layer_idx)
            out = layer.attend_one(q_rot, k_rot, v, self.scaling) if layer is not None else None
            if out is not None:  # a decode step over a packed KV cache, from its codes
                return self.o_proj(out.reshape(*input_shape, -1).contiguous()), None
        if cache is not None:
            k_rot, v = cache.update(k_rot, v, self.layer_idx, kwargs=kwargs)
        interface = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, eager_attention_forward)
        out, weights = interface(self, q_rot, k_rot, v, attention_mask,
                                 dropout=0.0 if not self.training else self.attention_dropout,
                                 scaling=self.scaling, **kwargs)
        return self.o_proj(out.reshape(*input_shape, -1).contiguous()), weights


def _packed_layer(cache, idx: int):
    """The cache's layer ``idx`` where it is lowbit's packed KV layer (else None)."""
    from lowbit.nn.kv_cache import PackedKVLayer

    layers = getattr(cache, "layers", None)
    layer = layers[idx] if layers is not None and idx < len(layers) else None
    return layer if isinstance(layer, PackedKVLayer) else None


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(ATTENTION, attention)
    # masks built exactly as for sdpa (None where sdpa may skip them); without this Hugging Face
    # would treat the name as a backend that needs no mask and drop the padding of a batch
    ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION, sdpa_mask)


def use_native_ops(model: nn.Module) -> Counter:
    """Swap ``model``'s supported norms for :class:`NativeRMSNorm`, its ``sdpa`` attention for
    :func:`attention` and Llama attention modules for a subclass with the native rotary embedding
    (in place); returns what it swapped (``norms``, ``attention``, ``rope``)."""
    from lowbit.models.module_paths import set_path

    counts: Counter = Counter()
    for mod in model.modules():
        if type(mod) is LlamaAttention:
            mod.__class__ = NativeLlamaAttention
            counts["rope"] += 1
    for name, mod in list(model.named_modules()):
        if (type(mod).__name__ in NORM_CLASSES and isinstance(getattr(mod, "weight", None), torch.Tensor)
                and hasattr(mod, "variance_epsilon")):
            set_path(model, name, NativeRMSNorm(mod))
            counts["norms"] += 1
    config = getattr(model, "config", None)
    if config is not None and getattr(config, "_attn_implementation", None) == "sdpa":
        _register()
        model.set_attn_implementation(ATTENTION)
        counts["attention"] += 1
    return counts
