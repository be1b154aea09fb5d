"""A KV cache stored packed: asymmetric low-bit codes with one FP16 scale and zero point per
token per head (any head_dim), as Atom does, or per group of ``group`` values of a head (wide
heads: Gemma 3's 256 values behind one scale lose far more than 64), behind transformers'
``Cache`` interface.

Every update quantizes the new keys/values, appends the packed codes, and returns the whole
cache dequantized, including the tokens just written, so prefill and decode both attend to
exactly what is stored (this is also what perplexity measures).

With ``hadamard`` (QuaRot's R3) each head's keys and values are rotated by the orthonormal
Hadamard ``R`` of order head_dim before they are quantized and rotated back (``Rᵀ``) when read:
by the butterfly of ``fast_transform`` where head_dim is a power of two (``R = Rᵀ``; the C decode
step repeats its bits), by a dense product otherwise.
Keys arrive after RoPE, so attention sees ``q·(k̂)ᵀ`` with ``k̂ = deq(k R) Rᵀ``, which equals
rotating both q and k online, as QuaRot's kernels do. A head's few large channels (RoPE's
low-frequency pairs) then no longer set the scale of every token.
"""

from __future__ import annotations

import contextlib
from functools import lru_cache

import torch
from transformers.cache_utils import Cache, DynamicLayer

from lowbit.formats import PerToken, QParams, choose_qparams, dequantize, pack, packed_size, quantize, unpack
from lowbit.formats.hadamard import fast_transform, orthonormal
from lowbit.kernels.cpu import hadamard as hadamard_kernels
from lowbit.kernels.cpu import kv_packed


def head_dim(config) -> int:
    """The attention head width of a transformers text config."""
    config = config.get_text_config(decoder=True)
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


@lru_cache(maxsize=None)
def head_rotation(n: int) -> torch.Tensor:
    """The float32 orthonormal Hadamard of order ``n``, built once per order and shared read-only
    by every layer's keys and values; HadamardSizeError names an order with no known matrix."""
    return orthonormal(n, torch.float32)


def _butterfly(x: torch.Tensor) -> torch.Tensor:
    """``fast_transform`` of float32 rows: in one C call where it applies (the same bits), else torch's."""
    y = hadamard_kernels.input_hadamard(x)
    return fast_transform(x) if y is None else y


class PackedKV:
    """``[B, H, T, D]`` states as packed codes ``[B, H, T·D/g, bytes]`` plus scale/zero ``[B, H, T·D/g]``
    (g = ``group``, or D when 0: one scale per token per head)."""

    def __init__(self, bits: int, symmetric: bool, hadamard: bool = False, group: int = 0):
        self.bits, self.symmetric, self.hadamard, self.group = bits, symmetric, hadamard, group
        self.rotation: torch.Tensor | None = None
        self._bufs: list | None = None  # codes, scale, zero (or None) with room to append (see reserve)
        self.rows = 0  # the stored rows: the first ``rows`` of each buffer
        self.head_dim = 0

    def append(self, x: torch.Tensor) -> None:
        b, h, t, d = x.shape
        g = self.group or d
        if d % g:
            raise ValueError(f"KV cache groups of {g} values do not divide head_dim {d}")
        self.head_dim = d
        if self.hadamard:
            x = self.rotate(x)
        x = x.reshape(b, h, t * (d // g), g)  # a group is a row: PerToken quantizes each one
        if not self.symmetric:
            fast = kv_packed.kv_quant_rows(x.reshape(-1, g).float(), self.bits) if x.is_cpu else None
            if fast is not None:  # the same bits in one native call (a decode step appends 2 per layer)
                codes, scale, zero = fast
                self._append_rows(codes.reshape(b, h, t * (d // g), -1), scale.reshape(b, h, -1), zero.reshape(b, h, -1))
                return
        qp = choose_qparams(x, self.bits, symmetric=self.symmetric, granularity=PerToken(), scale_dtype=torch.float16)
        q = quantize(x, qp)
        if self.symmetric:
            q = (q.to(torch.int16) + 2 ** (self.bits - 1)).to(torch.uint8)
        codes = pack(q, self.bits)
        scale = qp.scale.reshape(b, h, -1)
        zero = qp.zero_point.to(torch.uint8).reshape(b, h, -1) if qp.zero_point is not None else None
        self._append_rows(codes, scale, zero)

    def rotate(self, x: torch.Tensor) -> torch.Tensor:
        """``x R`` in float32 over the last dimension (R the orthonormal Hadamard of that order)."""
        d = x.shape[-1]
        if d & (d - 1) == 0:
            return _butterfly(x.float())
        if self.rotation is None:
            self.rotation = head_rotation(d).to(x.device)
        return x.float() @ self.rotation

    def unrotate(self, y: torch.Tensor) -> torch.Tensor:
        """``y Rᵀ`` in float32 (for a power of two ``Rᵀ = R``: the same butterfly)."""
        d = y.shape[-1]
        return _butterfly(y.float()) if d & (d - 1) == 0 else y.float() @ self.rotation.T

    def append_read(self, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """:meth:`append` then :meth:`dequantize`: in one native call where it applies
        (``kv_append_read``: the same bits), else the two steps."""
        b, h, t, d = x.shape
        g = self.group or d
        if not self.symmetric and self.bits in (4, 8) and d % g == 0 and self.head_dim in (0, d) and x.is_cpu:
            per, n = d // g, self.rows
            self.head_dim = d
            bufs = self.reserve((b, h), t * per, x.device)
            out = kv_packed.kv_append_read(x, bufs, n // per, self.bits, g, self.hadamard, dtype)
            if out is not None:
                self.rows = n + t * per
                return out
        self.append(x)
        return self.dequantize(dtype)

    def reserve(self, shape: tuple, new: int, device: torch.device | str | None = None) -> list:
        """The buffers, with room for ``new`` rows after the stored ones (``shape``: batch and heads;
        laid out for :attr:`head_dim`, which must be set; ``device`` where none exist yet, the CPU
        by default): codes of ``packed_size(g, bits)`` bytes a row, fp16 scales, uint8 zero points
        (none when symmetric). Grown by an eighth (at least 256 rows) when full, so one decode step
        copies its own rows, not the whole cache. :meth:`nbytes` counts the stored rows; the
        buffers hold more."""
        n = self.rows
        bufs = self._bufs
        if bufs is not None and tuple(bufs[0].shape[:2]) != tuple(shape):
            if n:
                raise ValueError(f"the KV cache holds batch x heads {tuple(bufs[0].shape[:2])}, new states have "
                                 f"{tuple(shape)}")
            bufs = self._bufs = None  # nothing stored (a first append that failed): lay out afresh
        if bufs is None or bufs[0].shape[2] < n + new:
            device = bufs[0].device if bufs is not None else device or "cpu"
            layout = (((packed_size(self.group or self.head_dim, self.bits),), torch.uint8), ((), torch.float16),
                      None if self.symmetric else ((), torch.uint8))
            cap = n + new + max(256, (n + new) // 8)
            grown = []
            for old, spec in zip((self.codes, self.scale, self.zero), layout):
                buf = None if spec is None else torch.empty((*shape, cap, *spec[0]), dtype=spec[1], device=device)
                if old is not None:
                    buf[:, :, :n] = old
                grown.append(buf)
            bufs = self._bufs = grown
        return bufs

    def _stored(self, i: int) -> torch.Tensor | None:
        buf = None if self._bufs is None else self._bufs[i]
        return None if buf is None else buf[:, :, :self.rows]

    codes = property(lambda self: self._stored(0), doc="packed codes ``[B, H, rows, g·bits/8]`` uint8")
    scale = property(lambda self: self._stored(1), doc="fp16 scales ``[B, H, rows]``")
    zero = property(lambda self: self._stored(2), doc="uint8 zero points ``[B, H, rows]`` (None if symmetric)")

    def _append_rows(self, codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None) -> None:
        """Write the new rows after the stored ones (:meth:`reserve`)."""
        n, new = self.rows, codes.shape[2]
        bufs = self.reserve(codes.shape[:2], new, codes.device)
        for buf, part in zip(bufs, (codes, scale, zero)):
            if part is not None:
                buf[:, :, n:n + new] = part
        self.rows = n + new

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        d = self.head_dim
        q = unpack(self.codes, self.bits, self.group or d)
        if self.symmetric:
            q = (q.to(torch.int16) - 2 ** (self.bits - 1)).to(torch.int8)
        zp = self.zero.reshape(-1).to(torch.int32) if self.zero is not None else None
        qp = QParams(self.scale.reshape(-1), zp, self.bits, self.symmetric, True, PerToken())
        b, h = q.shape[:2]
        if self.hadamard:
            return self.unrotate(dequantize(q, qp, torch.float32).reshape(b, h, -1, d)).to(dtype)
        return dequantize(q, qp, dtype).reshape(b, h, -1, d)

    def index_select(self, idx: torch.Tensor) -> None:
        if self._bufs is not None:
            self._bufs = [None if b is None else b.index_select(0, idx) for b in self._bufs]

    def nbytes(self) -> int:
        ts = [t for t in (self.codes, self.scale, self.zero) if t is not None]
        return sum(t.numel() * t.element_size() for t in ts)


class PackedKVLayer(DynamicLayer):
    """One layer's packed keys and values. Built on ``DynamicLayer`` with the few members of
    transformers' ``BaseQuantizedLayer`` (5.2x) written out, so it also runs under the older
    transformers that vLLM's CPU build pins (5.19 has no such base class)."""

    is_croppable = False  # packed codes cannot be cut back token by token

    def __init__(self, bits: int = 4, symmetric: bool = False, hadamard: bool = False, group: int = 0):
        super().__init__()
        self.bits, self.symmetric, self.hadamard, self.group = bits, symmetric, hadamard, group
        self.cumulative_length = 0
        self._quantized_keys = self._quantized_values = None

    def reset(self) -> None:
        """Drop the packed states (the next update starts from scratch)."""
        super().reset()
        self.cumulative_length = 0
        self._quantized_keys = self._quantized_values = None

    def get_seq_length(self) -> int:
        return self.cumulative_length

    def lazy_initialization(self, key_states, value_states) -> None:
        super().lazy_initialization(key_states, value_states)
        self._quantized_keys = PackedKV(self.bits, self.symmetric, self.hadamard, self.group)
        self._quantized_values = PackedKV(self.bits, self.symmetric, self.hadamard, self.group)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        with self._both_or_neither():
            out = (self._quantized_keys.append_read(key_states, key_states.dtype),
                   self._quantized_values.append_read(value_states, value_states.dtype))
        self.cumulative_length += key_states.shape[-2]
        return out

    @contextlib.contextmanager
    def _both_or_neither(self):
        """Keys and values stored together: where the values raise (NaN/Inf, a scale beyond fp16)
        after the keys went in, the keys' new rows are dropped again, so the two sides never
        disagree on how many positions they hold."""
        keys, values = self._quantized_keys, self._quantized_values
        rows = keys.rows, values.rows
        try:
            yield
        except BaseException:
            keys.rows, values.rows = rows
            raise

    def attend_one(self, query: torch.Tensor, key_states: torch.Tensor, value_states: torch.Tensor,
                   scaling: float) -> torch.Tensor | None:
        """A decode step's attention straight from the packed codes: stores the new token's keys and
        values, then attends ``query [B, Hq, 1, D]`` over every stored position with no mask, never
        dequantizing the cache (with ``hadamard`` the query is rotated in and the result out, as
        ``q·(k̂)ᵀ = (qR)·deq(kR)ᵀ``). Returns ``[B, 1, Hq, D]`` in the query's dtype, or None (nothing
        stored) where the native kernel does not take this layout: then ``update`` is the way."""
        d = query.shape[-1]
        if not self.is_initialized or not kv_packed.packed_decode_applies(query, self.bits, self.group or d, d):
            return None
        out = self._one_call(query, key_states, value_states, scaling)
        if out is not None:
            return out
        keys, values = self._quantized_keys, self._quantized_values
        with self._both_or_neither():
            keys.append(key_states)
            values.append(value_states)
        self.cumulative_length += key_states.shape[-2]
        q = keys.rotate(query) if self.hadamard else query
        out = kv_packed.attention_decode_packed(q, keys.codes, keys.scale, keys.zero, values.codes, values.scale,
                                                 values.zero, self.bits, self.group or d, scaling)
        if self.hadamard:
            out = values.unrotate(out)
        return out.to(query.dtype).unsqueeze(1)

    def _one_call(self, query, key_states, value_states, scaling) -> torch.Tensor | None:
        """:meth:`attend_one` as one native call (``kv_decode_step``: the same bits), or None where
        it does not apply (a symmetric cache, a dense rotation, other dtypes or layouts)."""
        keys, values = self._quantized_keys, self._quantized_values
        d = query.shape[-1]
        g = self.group or d
        if self.symmetric or not keys.rows or keys.rows != values.rows or keys.head_dim != d or key_states.shape[-2] != 1:
            return None
        n = keys.rows
        per = d // g
        shape = key_states.shape[:2]
        kb, vb = keys.reserve(shape, per), values.reserve(shape, per)
        out = kv_packed.kv_decode_step(query, key_states, value_states, kb, vb, n // per, self.bits, g, self.hadamard,
                                        scaling)
        if out is None:
            return None
        keys.rows = values.rows = n + per
        self.cumulative_length += 1
        return out

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

    def __init__(self, config, bits: int = 4, symmetric: bool = False, hadamard: bool = False, group: int = 0):
        if hadamard:
            head_rotation(head_dim(config))  # an unknown order fails here, before any forward
        if group and head_dim(config) % group:
            raise ValueError(f"kv_cache.group_size {group} does not divide the model's head_dim {head_dim(config)} "
                             f"(model_type={getattr(config, 'model_type', None)!r}); use a divisor or 0 (whole head)")
        config = config.get_text_config(decoder=True)
        types = set(getattr(config, "layer_types", None) or ["full_attention"])
        if types - set(self.KINDS):
            raise ValueError(f"PackedKVCache supports {' and '.join(self.KINDS)} layers, model_type="
                             f"{getattr(config, 'model_type', None)!r} has {sorted(types - set(self.KINDS))}")
        super().__init__(layers=[PackedKVLayer(bits, symmetric, hadamard, group) for _ in range(config.num_hidden_layers)])
        self.bits, self.symmetric, self.hadamard, self.group = bits, symmetric, hadamard, group

    @classmethod
    def for_scheme(cls, config, kv) -> "PackedKVCache":
        """The cache a scheme's ``kv_cache`` part (:class:`lowbit.formats.scheme.KVArgs`) describes."""
        return cls(config, kv.bits, kv.symmetric, kv.hadamard, kv.group_size)

    def nbytes(self) -> int:
        return sum(l.nbytes() for l in self.layers)


def install_kv_quantization(model, bits: int = 4, symmetric: bool = False, hadamard: bool = False,
                            group: int = 0) -> None:
    """Make every forward of ``model`` without a cache use a fresh :class:`PackedKVCache`
    (so perplexity sees the quantized KV), and ``generate`` use one too."""
    PackedKVCache(model.config, bits, symmetric, hadamard, group)  # a config it cannot serve fails now
    inner = model.model if hasattr(model, "model") else model

    def hook(module, args, kwargs):
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        if cache is None or (type(cache).__name__ == "DynamicCache" and cache.get_seq_length() == 0):
            kwargs.pop("past_key_values", None)
            kwargs["cache"] = PackedKVCache(model.config, bits, symmetric, hadamard, group)
        return args, kwargs

    inner._lowbit_kv_hook = inner.register_forward_pre_hook(hook, with_kwargs=True)


def install_scheme_kv_cache(model, kv) -> None:
    """:func:`install_kv_quantization` with a scheme's ``kv_cache`` part (``KVArgs``): the one place
    its fields map to the cache's arguments."""
    install_kv_quantization(model, kv.bits, kv.symmetric, kv.hadamard, kv.group_size)
