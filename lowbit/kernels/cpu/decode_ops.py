"""One-call CPU versions of a decode step's small non-linear ops (``csrc/decode_ops.c``):
RMSNorm, the rotary embedding and the attention of one new query over a float KV cache (over
lowbit's packed one: :mod:`.kv_packed`).

Each returns None where it does not apply (no C build, another device or dtype, a head dim over
256), so the caller keeps PyTorch's path; the torch formulas next to them are the references the
tests compare with.
"""

from __future__ import annotations

import ctypes

import torch

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
