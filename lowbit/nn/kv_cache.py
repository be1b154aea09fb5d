"""A KV cache stored packed: asymmetric low-bit codes with one FP16 scale and zero point per
token per head (any head_dim), as Atom does, behind transformers' ``Cache`` interface.

Every update quantizes the new keys/values, appends the packed codes, and returns the whole
cache dequantized, including the tokens just written, so prefill and decode both attend to
exactly what is stored (this is also what perplexity measures).
"""

from __future__ import annotations

import torch
from transformers.cache_utils import BaseQuantizedLayer, Cache

from lowbit.formats import PerToken, QParams, choose_qparams, dequantize, pack, packed_size, quantize, unpack


class PackedKV:
    """``[B, H, T, D]`` states as packed codes ``[B, H, T, bytes]`` plus scale/zero ``[B, H, T]``."""

    def __init__(self, bits: int, symmetric: bool):
        self.bits, self.symmetric = bits, symmetric
        self.codes: torch.Tensor | None = None
        self.scale: torch.Tensor | None = None
        self.zero: torch.Tensor | None = None
        self.head_dim = 0

    def append(self, x: torch.Tensor) -> None:
        b, h, t, d = x.shape
        self.head_dim = d
        qp = choose_qparams(x, self.bits, symmetric=self.symmetric, granularity=PerToken(), scale_dtype=torch.float16)
        q = quantize(x, qp)
        if self.symmetric:
            q = (q.to(torch.int16) + 2 ** (self.bits - 1)).to(torch.uint8)
        codes = pack(q, self.bits)
        scale = qp.scale.reshape(b, h, t)
        zero = qp.zero_point.to(torch.uint8).reshape(b, h, t) if qp.zero_point is not None else None
        if self.codes is None:
            self.codes, self.scale, self.zero = codes, scale, zero
        else:
            self.codes = torch.cat([self.codes, codes], dim=2)
            self.scale = torch.cat([self.scale, scale], dim=2)
            if zero is not None:
                self.zero = torch.cat([self.zero, zero], dim=2)

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        q = unpack(self.codes, self.bits, self.head_dim)
        if self.symmetric:
            q = (q.to(torch.int16) - 2 ** (self.bits - 1)).to(torch.int8)
        zp = self.zero.reshape(-1).to(torch.int32) if self.zero is not None else None
        qp = QParams(self.scale.reshape(-1), zp, self.bits, self.symmetric, True, PerToken())
        return dequantize(q, qp, dtype)

    def index_select(self, idx: torch.Tensor) -> None:
        self.codes = self.codes.index_select(0, idx)
        self.scale = self.scale.index_select(0, idx)
        if self.zero is not None:
            self.zero = self.zero.index_select(0, idx)

    def nbytes(self) -> int:
        ts = [t for t in (self.codes, self.scale, self.zero) if t is not None]
        return sum(t.numel() * t.element_size() for t in ts)


class PackedKVLayer(BaseQuantizedLayer):
    def __init__(self, bits: int = 4, symmetric: bool = False):
        super().__init__()
        self.bits, self.symmetric = bits, symmetric

    def _quantize(self, tensor):  # required by the base class; appending is done by PackedKV
        raise NotImplementedError

    def _dequantize(self, q_tensor):
        raise NotImplementedError

    def lazy_initialization(self, key_states, value_states) -> None:
        super().lazy_initialization(key_states, value_states)
        self._quantized_keys = PackedKV(self.bits, self.symmetric)
        self._quantized_values = PackedKV(self.bits, self.symmetric)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.cumulative_length += key_states.shape[-2]
        self._quantized_keys.append(key_states)
        self._quantized_values.append(value_states)
        return (self._quantized_keys.dequantize(key_states.dtype),
                self._quantized_values.dequantize(value_states.dtype))

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        if self.is_initialized:
            self._quantized_keys.index_select(beam_idx.to(self._quantized_keys.codes.device))
            self._quantized_values.index_select(beam_idx.to(self._quantized_values.codes.device))

    def nbytes(self) -> int:
        if not self.is_initialized:
            return 0
        return self._quantized_keys.nbytes() + self._quantized_values.nbytes()


class PackedKVCache(Cache):
    """``PackedKVCache(config, bits=4)``; pass it to ``model(..., cache=...)`` or ``generate``.

    Sliding-window layers (Gemma 2/3, Mistral) keep every token like full-attention ones: the
    model's sliding-window mask, built over the whole cache, limits what they attend to, so the
    result is the windowed attention over the stored codes (memory is not capped at the window)."""

    KINDS = ("full_attention", "sliding_attention")

    def __init__(self, config, bits: int = 4, symmetric: bool = False):
        config = config.get_text_config(decoder=True)
        types = set(getattr(config, "layer_types", None) or ["full_attention"])
        if types - set(self.KINDS):
            raise ValueError(f"PackedKVCache supports {' and '.join(self.KINDS)} layers, model_type="
                             f"{getattr(config, 'model_type', None)!r} has {sorted(types - set(self.KINDS))}")
        super().__init__(layers=[PackedKVLayer(bits, symmetric) for _ in range(config.num_hidden_layers)])
        self.bits, self.symmetric = bits, symmetric

    def nbytes(self) -> int:
        return sum(l.nbytes() for l in self.layers)


def install_kv_quantization(model, bits: int = 4, symmetric: bool = False) -> None:
    """Make every forward of ``model`` without a cache use a fresh :class:`PackedKVCache`
    (so perplexity sees the quantized KV), and ``generate`` use one too."""
    inner = model.model if hasattr(model, "model") else model

    def hook(module, args, kwargs):
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        if cache is None or (type(cache).__name__ == "DynamicCache" and cache.get_seq_length() == 0):
            kwargs.pop("past_key_values", None)
            kwargs["cache"] = PackedKVCache(model.config, bits, symmetric)
        return args, kwargs

    inner._lowbit_kv_hook = inner.register_forward_pre_hook(hook, with_kwargs=True)
