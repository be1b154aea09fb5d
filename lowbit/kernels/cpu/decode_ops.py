"""One-call CPU versions of a decode step's small non-linear ops (``csrc/decode_ops.c``):
RMSNorm, the rotary embedding and the attention of one new query over the KV cache (a plain
one, or a packed one: its new rows written, rotated and attended in one call).

Each returns None where it does not apply (no C build, another device or dtype, a head dim over
256), so the caller keeps PyTorch's path; the torch formulas next to them are the references the
tests compare with.
"""

from __future__ import annotations

import ctypes

import torch

from lowbit.kernels.cpu.hadamard import inverse_sqrt_f32
from lowbit.kernels.cpu.kernel_library import KernelLibrary

_F32, _BF16 = torch.float32, torch.bfloat16
MAX_HEAD_DIM = 256


def _bind(lib: ctypes.CDLL) -> None:
    i64, vp, ci, cf = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int, ctypes.c_float
    lib.rms_norm.argtypes = [vp, ci, i64, i64, vp, ci, cf, vp, ci, vp, ci]
    lib.rms_norm.restype = ci
    lib.attn_decode.argtypes = [vp, i64, i64, vp, i64, i64, i64, vp, i64, i64, i64, ci, i64, i64, i64, i64, i64, cf,
                                vp, ci]
    lib.attn_decode.restype = ci
    lib.rope.argtypes = [vp, i64, i64, i64, vp, vp, i64, ci, i64, i64, i64, i64, vp]
    lib.rope.restype = None
    side = [vp, vp, vp, i64, i64, i64, i64, i64, i64]
    lib.attn_decode_packed.argtypes = [vp] + side + side + [ci, i64, i64, i64, i64, i64, i64, cf, vp, ci]
    lib.attn_decode_packed.restype = ci
    lib.kv_quant_rows.argtypes = [vp, i64, i64, ci, vp, vp, vp]
    lib.kv_quant_rows.restype = ci
    lib.kv_decode_step.argtypes = [vp, i64, i64, vp, i64, i64, vp, i64, i64, ci, vp, vp, vp, vp, vp, vp, i64, i64, ci,
                                   i64, i64, i64, i64, i64, ci, cf, cf, vp, ci]
    lib.kv_decode_step.restype = ci


_LIB = KernelLibrary("decode ops", "decode_ops.c", _bind)


def _needs_grad(*ts: torch.Tensor) -> bool:
    """Whether autograd would record this op (the native ops have no backward): a parameter's
    ``requires_grad`` alone does not count under ``no_grad`` / ``inference_mode``."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in ts)


def library(flags: tuple[str, ...] | None = None) -> ctypes.CDLL | None:
    return _LIB.get(flags)


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Llama's RMSNorm as Hugging Face writes it (float32 statistic, cast, then weight)."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, lib=None,
             perm: torch.Tensor | None = None) -> torch.Tensor | None:
    """:func:`rms_norm_reference` in one call (None where it does not apply). The statistic is
    summed in double, torch's in float32, so 1/rms can differ by half the float32 sum's error: a
    float32 output by that plus a few roundings, a bf16 one by at most one step and rarely at all
    (tested). Called once per norm per decode step, so the checks are the cheap ones. With ``perm``
    (contiguous int64 ``[n]``, a permutation) the output's channels come out as ``y[..., perm]``,
    exactly those values, in the same pass (Atom's reorder after a norm)."""
    lib = lib or _LIB.get()
    xd, wd = x.dtype, weight.dtype
    if (lib is None or not (x.is_cpu and weight.is_cpu) or _needs_grad(x, weight)
            or (xd is not _F32 and xd is not _BF16) or (wd is not _F32 and wd is not _BF16) or weight.dim() != 1):
        return None
    n = weight.shape[0]
    if n == 0 or x.dim() == 0 or x.shape[-1] != n:
        return None
    if perm is not None and (perm.dtype != torch.int64 or tuple(perm.shape) != (n,) or not perm.is_contiguous()
                             or not perm.is_cpu):
        return None
    if not x.is_contiguous():
        x = x.contiguous()
    if not weight.is_contiguous():  # the kernel reads n values from weight's data pointer
        weight = weight.contiguous()
    out_bf16 = xd is _BF16 and wd is _BF16
    y = torch.empty_like(x, dtype=_BF16 if out_bf16 else _F32)
    if lib.rms_norm(x.data_ptr(), xd is _BF16, x.numel() // n, n, weight.data_ptr(), wd is _BF16, eps, y.data_ptr(),
                    out_bf16, None if perm is None else perm.data_ptr(), torch.get_num_threads()):
        raise ValueError(f"rms_norm: the output permutation holds an index outside [0, {n})")
    return y


def rope_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Llama's rotary embedding of ``x [B, H, S, D]`` with ``cos, sin [B, S, D]`` (Hugging Face's formula)."""
    half = x.shape[-1] // 2
    rot = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos.unsqueeze(1) + rot * sin.unsqueeze(1)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, lib=None) -> torch.Tensor | None:
    """:func:`rope_reference` in one call, the same bits (every product and sum rounded as torch
    rounds them); ``[B, H, S, D]`` contiguous, or None where it does not apply."""
    lib = lib or _LIB.get()
    dt = x.dtype
    if (lib is None or (dt is not _F32 and dt is not _BF16) or cos.dtype is not dt or sin.dtype is not dt
            or not (x.is_cpu and cos.is_cpu and sin.is_cpu) or _needs_grad(x, cos, sin) or x.dim() != 4
            or cos.dim() != 3 or sin.shape != cos.shape):
        return None
    B, H, S, D = x.shape
    if D % 2 or cos.shape[1:] != (S, D) or cos.shape[0] not in (1, B) or x.stride(3) != 1:
        return None
    if not (cos.is_contiguous() and sin.is_contiguous()):
        cos, sin = cos.contiguous(), sin.contiguous()
    xs = x.stride()
    out = torch.empty((B, H, S, D), dtype=dt)
    lib.rope(x.data_ptr(), xs[0], xs[1], xs[2], cos.data_ptr(), sin.data_ptr(), S * D if cos.shape[0] > 1 else 0,
             dt is _BF16, B, H, S, D, out.data_ptr())
    return out


def attention_decode_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """``q [B, Hq, 1, D]`` over ``k, v [B, Hkv, L, D]`` with no mask → ``[B, 1, Hq, D]`` (float64 math)."""
    groups = q.shape[1] // k.shape[1]
    kk = k.double().repeat_interleave(groups, 1)
    vv = v.double().repeat_interleave(groups, 1)
    p = torch.softmax(q.double() @ kk.transpose(-1, -2) * scale, dim=-1)
    return (p @ vv).transpose(1, 2).to(q.dtype)


def attention_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, lib=None) -> torch.Tensor | None:
    """Attention of one query token per sequence over the whole cache, no mask: ``q [B, Hq, 1, D]``,
    ``k, v [B, Hkv, L, D]`` (any strides with a unit last one) → ``[B, 1, Hq, D]`` contiguous, the
    layout Hugging Face's attention functions return. float32 math; None where it does not apply."""
    lib = lib or _LIB.get()
    dt = q.dtype
    if (lib is None or (dt is not _F32 and dt is not _BF16) or k.dtype is not dt or v.dtype is not dt
            or not (q.is_cpu and k.is_cpu and v.is_cpu) or _needs_grad(q, k, v) or q.dim() != 4 or k.dim() != 4
            or v.shape != k.shape):
        return None
    B, Hq, one, D = q.shape
    _, Hkv, L, _ = k.shape
    if (one != 1 or k.shape[0] != B or k.shape[3] != D or D > MAX_HEAD_DIM or Hkv == 0 or Hq % Hkv or L == 0
            or B * Hq == 0):
        return None
    qs, ks, vs = q.stride(), k.stride(), v.stride()
    if qs[3] != 1 or ks[3] != 1 or vs[3] != 1:
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        qs, ks, vs = q.stride(), k.stride(), v.stride()
    out = torch.empty((B, 1, Hq, D), dtype=dt)
    if lib.attn_decode(q.data_ptr(), qs[0], qs[1], k.data_ptr(), ks[0], ks[1], ks[2], v.data_ptr(), vs[0], vs[1],
                       vs[2], dt is _BF16, B, Hq, Hkv, L, D, scale, out.data_ptr(), torch.get_num_threads()):
        raise MemoryError("attention_decode: out of memory for its score buffer")
    return out


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
    B, Hq, _, D = q.shape
    Hkv, rows = k_codes.shape[1], k_codes.shape[2]
    L = rows * group // D
    for t in (k_codes, k_scale, v_codes, v_scale) + tuple(z for z in (k_zero, v_zero) if z is not None):
        if t.stride(-1) != 1 or (t.dim() == 4 and t.stride(2) != t.shape[3]):
            raise ValueError("attention_decode_packed: the cache's rows must be contiguous")
    if (k_scale.dtype != torch.float16 or v_scale.dtype != torch.float16 or k_codes.dtype != torch.uint8
            or v_codes.shape != k_codes.shape or k_scale.shape != (B, Hkv, rows) or v_scale.shape != k_scale.shape):
        raise ValueError("attention_decode_packed: codes, scales and zero points do not form one packed cache")
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


def _side_buffers(bufs, B: int, Hkv: int, rb: int) -> bool:
    codes, scale, zero = bufs
    cap = codes.shape[2] if codes.dim() == 4 else -1
    return (zero is not None and codes.dtype == torch.uint8 and scale.dtype == torch.float16 and zero.dtype == torch.uint8
            and codes.shape == (B, Hkv, cap, rb) and scale.shape == (B, Hkv, cap) and zero.shape == scale.shape
            and all(t.is_contiguous() and t.is_cpu for t in bufs))


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
            or _needs_grad(q, k, v) or not 0 < D <= MAX_HEAD_DIM or group <= 0 or D % group or bits not in (4, 8)
            or group * bits % 8 or (rotate and D & (D - 1)) or q.stride(3) != 1 or k.stride(3) != 1 or v.stride(3) != 1):
        return None
    rb = group * bits // 8
    if not (_side_buffers(k_bufs, B, Hkv, rb) and _side_buffers(v_bufs, B, Hkv, rb)) or k_bufs[0].shape != v_bufs[0].shape:
        return None
    cap = k_bufs[0].shape[2]
    if (n + 1) * (D // group) > cap:
        return None
    out = torch.empty((B, 1, Hq, D), dtype=q.dtype)
    rc = lib.kv_decode_step(q.data_ptr(), q.stride(0), q.stride(1), k.data_ptr(), k.stride(0), k.stride(1), v.data_ptr(),
                            v.stride(0), v.stride(1), q.dtype is _BF16, *(t.data_ptr() for t in k_bufs),
                            *(t.data_ptr() for t in v_bufs), cap, n, bits, group, B, Hq, Hkv, D, bool(rotate),
                            inverse_sqrt_f32(D), scale, out.data_ptr(), torch.get_num_threads())
    if rc == 1:
        raise MemoryError("kv_decode_step: out of memory for its score buffer")
    return None if rc else out
