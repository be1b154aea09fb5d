"""lowbit's packed KV cache (``lowbit.nn.kv_cache.PackedKV``) in C (``csrc/kv_packed.c``): its
rows quantized, a decode step's attention read straight from the codes, a whole decode step in
one call, and a prefill's append-then-read-back in one call.

Each returns None where it does not apply (no C build, another device, dtype or layout, rows it
leaves to the generic path), so the caller keeps the torch path, whose bits the tests hold these
to.
"""

from __future__ import annotations

import ctypes

import torch

from lowbit.kernels.cpu.decode_ops import MAX_HEAD_DIM, _needs_grad
from lowbit.kernels.cpu.hadamard import inverse_sqrt_f32
from lowbit.kernels.cpu.kernel_library import KernelLibrary

_F32, _BF16 = torch.float32, torch.bfloat16


def _bind(lib: ctypes.CDLL) -> None:
    i64, vp, ci, cf = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int, ctypes.c_float
    side = [vp, vp, vp, i64, i64, i64, i64, i64, i64]
    lib.attn_decode_packed.argtypes = [vp] + side + side + [ci, i64, i64, i64, i64, i64, i64, cf, vp, ci]
    lib.attn_decode_packed.restype = ci
    lib.kv_quant_rows.argtypes = [vp, i64, i64, ci, vp, vp, vp]
    lib.kv_quant_rows.restype = ci
    lib.kv_decode_step.argtypes = [vp, i64, i64, vp, i64, i64, vp, i64, i64, ci, vp, vp, vp, vp, vp, vp, i64, i64, ci,
                                   i64, i64, i64, i64, i64, ci, cf, cf, vp, ci]
    lib.kv_decode_step.restype = ci
    lib.kv_append_read.argtypes = [vp, i64, i64, i64, ci, vp, vp, vp, i64, i64, i64, ci, i64, i64, i64, i64, ci, cf, vp,
                                   ci, ci]
    lib.kv_append_read.restype = ci


_LIB = KernelLibrary("packed KV cache", "kv_packed.c", _bind)


def library(flags: tuple[str, ...] | None = None) -> ctypes.CDLL | None:
    return _LIB.get(flags)


def _packed_side(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None) -> list:
    """A packed cache side's pointers and (batch, head) strides, as attn_decode_packed takes them."""
    z = [0, 0, 0] if zero is None else [zero.data_ptr(), zero.stride(0), zero.stride(1)]
    return [codes.data_ptr(), scale.data_ptr(), z[0], codes.stride(0), codes.stride(1), scale.stride(0), scale.stride(1),
            z[1], z[2]]


def packed_decode_applies(q: torch.Tensor, bits: int, group: int, head_dim: int) -> bool:
    """Whether :func:`attention_decode_packed` takes this query and cache layout (else the caller
    dequantizes the cache and runs an ordinary attention)."""
    return (_LIB.get() is not None and q.is_cpu and q.dim() == 4 and q.shape[2] == 1 and not _needs_grad(q)
            and q.dtype in (_F32, _BF16, torch.float16) and bits in (4, 8) and 0 < head_dim <= MAX_HEAD_DIM
            and q.shape[3] == head_dim and head_dim % group == 0 and (bits == 8 or group % 2 == 0))


def _check_packed_cache(q, k_codes, k_scale, k_zero, v_codes, v_scale, v_zero, bits: int, group: int) -> None:
    """ValueError unless the tensors form the packed cache the C reads (its row bytes, L·D/g rows,
    scales and zero points of that many rows, every tensor on the CPU, rows contiguous): the C
    trusts these sizes, so a wrong one would read past the tensors."""
    what = "attention_decode_packed"
    if q.dim() != 4 or q.shape[2] != 1 or not 0 < q.shape[3] <= MAX_HEAD_DIM:
        raise ValueError(f"{what}: needs one query token [B, Hq, 1, D] with D <= {MAX_HEAD_DIM}, got {tuple(q.shape)}")
    B, Hq, _, D = q.shape
    if bits not in (4, 8) or group <= 0 or D % group or group * bits % 8:
        raise ValueError(f"{what}: {bits}-bit codes in groups of {group} over head_dim {D} are not supported")
    zeros = tuple(z for z in (k_zero, v_zero) if z is not None)
    tensors = (q, k_codes, k_scale, v_codes, v_scale) + zeros
    if any(not isinstance(t, torch.Tensor) or not t.is_cpu for t in tensors):
        raise ValueError(f"{what}: the query and every cache tensor must be CPU tensors")
    if k_codes.dim() != 4 or k_codes.shape[0] != B or k_codes.shape[3] != group * bits // 8:
        raise ValueError(f"{what}: codes must be [B, Hkv, rows, {group * bits // 8}] for {bits}-bit groups of {group}, "
                         f"got {tuple(k_codes.shape)}")
    Hkv, rows = k_codes.shape[1], k_codes.shape[2]
    if Hkv == 0 or Hq % Hkv or rows % (D // group):
        raise ValueError(f"{what}: {Hq} query heads over {Hkv} KV heads, {rows} rows of {group} values over head_dim {D}")
    if (k_codes.dtype != torch.uint8 or v_codes.dtype != torch.uint8 or v_codes.shape != k_codes.shape
            or k_scale.dtype != torch.float16 or v_scale.dtype != torch.float16
            or k_scale.shape != (B, Hkv, rows) or v_scale.shape != k_scale.shape
            or (k_zero is None) != (v_zero is None)
            or any(z.dtype != torch.uint8 or z.shape != k_scale.shape for z in zeros)):
        raise ValueError(f"{what}: codes, scales and zero points do not form one packed cache")
    for t in tensors[1:]:
        if t.stride(-1) != 1 or (t.dim() == 4 and t.stride(2) != t.shape[3]):
            raise ValueError(f"{what}: the cache's rows must be contiguous")


def attention_decode_packed(q: torch.Tensor, k_codes: torch.Tensor, k_scale: torch.Tensor, k_zero: torch.Tensor | None,
                            v_codes: torch.Tensor, v_scale: torch.Tensor, v_zero: torch.Tensor | None, bits: int,
                            group: int, scale: float, lib=None) -> torch.Tensor:
    """One query token per sequence over a packed KV cache (``lowbit.nn.kv_cache.PackedKV``'s codes
    ``[B, Hkv, L·D/g, g·bits/8]`` uint8, fp16 scales and uint8 zero points ``[B, Hkv, L·D/g]``, zero
    points None for a symmetric cache), no mask, straight from the codes: ``q [B, Hq, 1, D]`` in the
    cache's domain → float32 ``[B, Hq, D]`` (the caller rotates q in and the result out where the
    cache is rotated). float32 math; the same attention as over the dequantized cache up to float32
    rounding (the dequantized path rounds keys and values to the model's dtype first)."""
    lib = lib or _LIB.get()
    _check_packed_cache(q, k_codes, k_scale, k_zero, v_codes, v_scale, v_zero, bits, group)
    B, Hq, _, D = q.shape
    Hkv, rows = k_codes.shape[1], k_codes.shape[2]
    L = rows * group // D
    qf = q.reshape(B, Hq, D).float().contiguous()
    out = torch.empty((B, Hq, D), dtype=torch.float32)
    rc = lib.attn_decode_packed(qf.data_ptr(), *_packed_side(k_codes, k_scale, k_zero), *_packed_side(v_codes, v_scale, v_zero),
                                bits, group, B, Hq, Hkv, L, D, scale, out.data_ptr(), torch.get_num_threads())
    if rc == 1:
        raise MemoryError("attention_decode_packed: out of memory for its score buffer")
    if rc:
        raise ValueError(f"attention_decode_packed: {bits}-bit codes in groups of {group} over head_dim {D} are not supported")
    return out


def kv_quant_rows(x: torch.Tensor, bits: int, lib=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """A packed KV cache's asymmetric rows in one native call: float32 ``x [N, g]`` → packed codes
    ``[N, g·bits/8]`` uint8, fp16 scales and uint8 zero points ``[N]``, the bits of
    ``lowbit.formats``' choose_qparams / quantize / pack (tested equal). None where it does not
    apply (no library, bits other than 4 and 8, NaN/Inf in x, a scale beyond fp16): the caller
    then takes that generic path, which raises for bad input."""
    lib = lib or _LIB.get()
    if lib is None or x.dtype is not _F32 or x.dim() != 2 or not x.is_cpu or bits not in (4, 8) or x.shape[1] * bits % 8:
        return None
    x = x.contiguous()
    n, g = x.shape
    codes = torch.empty((n, g * bits // 8), dtype=torch.uint8)
    scale = torch.empty(n, dtype=torch.float16)
    zero = torch.empty(n, dtype=torch.uint8)
    if lib.kv_quant_rows(x.data_ptr(), n, g, bits, codes.data_ptr(), scale.data_ptr(), zero.data_ptr()):
        return None
    return codes, scale, zero


def _one_call_takes(D: int, group: int, bits: int, rotate: bool, bufs, B: int, H: int, positions: int) -> bool:
    """Whether the one-call paths take heads of D values in groups of ``group`` at ``bits`` (rotated
    by the butterfly, which needs a power of two) and an asymmetric cache side's buffers ``bufs``
    (codes ``[B, H, cap, g·bits/8]`` uint8, fp16 scales and uint8 zero points ``[B, H, cap]``,
    contiguous, on the CPU) with room for ``positions`` positions."""
    if (not 0 < D <= MAX_HEAD_DIM or group <= 0 or D % group or bits not in (4, 8) or group * bits % 8
            or (rotate and D & (D - 1))):
        return False
    codes, scale, zero = bufs
    cap = codes.shape[2] if codes.dim() == 4 else -1
    return (zero is not None and codes.dtype == torch.uint8 and scale.dtype == torch.float16 and zero.dtype == torch.uint8
            and codes.shape == (B, H, cap, group * bits // 8) and scale.shape == (B, H, cap) and zero.shape == scale.shape
            and all(t.is_contiguous() and t.is_cpu for t in bufs) and positions * (D // group) <= cap)


def kv_decode_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_bufs, v_bufs, n: int, bits: int, group: int,
                   rotate: bool, scale: float, lib=None) -> torch.Tensor | None:
    """A decode step over an asymmetric packed KV cache in one call: the new keys and values ``k, v
    [B, Hkv, 1, D]`` rotated (``rotate``: by the Hadamard of order D, a power of two) and quantized
    into position ``n`` of the cache's buffers (``k_bufs``/``v_bufs``: codes ``[B, Hkv, cap,
    g·bits/8]``, fp16 scales and uint8 zero points ``[B, Hkv, cap]``, contiguous, room for
    ``(n + 1)·D/g`` rows), then ``q [B, Hq, 1, D]`` rotated in, attended over positions ``0 .. n``
    and rotated back: ``[B, 1, Hq, D]`` in q's dtype. The same bits as ``fast_transform``,
    :func:`kv_quant_rows`, :func:`attention_decode_packed`, ``fast_transform`` and the cast called
    in turn (tested). None where it does not apply (no library, other dtypes or layouts, NaN/Inf
    in k or v, a scale beyond fp16): the caller then takes that path, which raises for bad input."""
    lib = lib or _LIB.get()
    if lib is None or q.dim() != 4 or q.dtype not in (_F32, _BF16) or k.dtype != q.dtype or v.dtype != q.dtype:
        return None
    B, Hq, one, D = q.shape
    Hkv = k.shape[1]
    if (one != 1 or k.shape != (B, Hkv, 1, D) or v.shape != k.shape or not (q.is_cpu and k.is_cpu and v.is_cpu)
            or _needs_grad(q, k, v) or q.stride(3) != 1 or k.stride(3) != 1 or v.stride(3) != 1):
        return None
    if (not _one_call_takes(D, group, bits, rotate, k_bufs, B, Hkv, n + 1)
            or not _one_call_takes(D, group, bits, rotate, v_bufs, B, Hkv, n + 1) or k_bufs[0].shape != v_bufs[0].shape):
        return None
    cap = k_bufs[0].shape[2]
    out = torch.empty((B, 1, Hq, D), dtype=q.dtype)
    rc = lib.kv_decode_step(q.data_ptr(), q.stride(0), q.stride(1), k.data_ptr(), k.stride(0), k.stride(1), v.data_ptr(),
                            v.stride(0), v.stride(1), q.dtype is _BF16, *(t.data_ptr() for t in k_bufs),
                            *(t.data_ptr() for t in v_bufs), cap, n, bits, group, B, Hq, Hkv, D, bool(rotate),
                            inverse_sqrt_f32(D), scale, out.data_ptr(), torch.get_num_threads())
    if rc == 1:
        raise MemoryError("kv_decode_step: out of memory for its score buffer")
    return None if rc else out


def kv_append_read(x: torch.Tensor, bufs, n: int, bits: int, group: int, rotate: bool, dtype: torch.dtype,
                   lib=None) -> torch.Tensor | None:
    """``PackedKV.append(x)`` then ``PackedKV.dequantize(dtype)`` for an asymmetric cache in one call:
    the new positions of ``x [B, H, t, D]`` rotated (``rotate``: the butterfly, D a power of two)
    and quantized into positions ``n ..`` of the buffers ``bufs`` (codes, fp16 scales, uint8 zero
    points, contiguous, room for ``(n + t)·D/g`` rows), then every stored position dequantized and
    rotated back: ``[B, H, n + t, D]`` in ``dtype``. The same bits as those steps (tested). None
    where it does not apply (no library, other dtypes or layouts, NaN/Inf in x, a scale beyond
    fp16): the caller then takes the steps, which raise for bad input."""
    lib = lib or _LIB.get()
    if (lib is None or x.dim() != 4 or x.dtype not in (_F32, _BF16) or dtype not in (_F32, _BF16) or not x.is_cpu
            or _needs_grad(x) or x.stride(3) != 1):
        return None
    B, H, t, D = x.shape
    if not _one_call_takes(D, group, bits, rotate, bufs, B, H, n + t):
        return None
    out = torch.empty((B, H, n + t, D), dtype=dtype)
    rc = lib.kv_append_read(x.data_ptr(), x.stride(0), x.stride(1), x.stride(2), x.dtype is _BF16,
                            *(b.data_ptr() for b in bufs), bufs[0].shape[2], n, t, bits, group, B, H, D, bool(rotate),
                            inverse_sqrt_f32(D), out.data_ptr(), dtype is _BF16, torch.get_num_threads())
    return None if rc else out
