"""lowbit's INT8-weight CPU kernel (``csrc/w8_gemv.c``): the weight stays 1 byte per value and
products are exact int32 sums (``vpmaddwd`` on sign-extended codes). 4 output rows share every
activation load, 4 tokens share every sign extension.

W8A8 (:func:`run_codes`): per-token INT8 codes, one float32 rescale by weight scale x activation
scale. W8A16 (:func:`run`): the kernel rounds the activations to int16 per block of 256 channels
(step s_b = absmax_b/32767, |Δx| ≤ s_b/2) and sums the blocks' rescaled products in float32;
tested within Σ_b (s_b/2)·Σ|w| + 2^-20·Σ|x||w| of the float64 reference. A NaN/Inf activation
makes its token's outputs NaN.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from lowbit.kernels.cpu import a16_linear, act_sym
from lowbit.kernels.cpu.kernel_library import KernelLibrary
from lowbit.kernels.cpu.native_args import CachedPointers, require_cpu, require_state
from lowbit.kernels.linear_params import KernelError

CHUNK = 32  # input channels per 32-byte chunk of codes
# W8A8's codes products are one int32 per row: |P| <= k_pad * 128 * 128 for codes of the INT8 range
MAX_CODES_IN = (2 ** 31 - 1) // (128 * 128)
PORTABLE_FLAGS = ("-O3", "-DW8_NO_SIMD")


def _bind(lib: ctypes.CDLL) -> None:
    i64, vp = ctypes.c_int64, ctypes.c_void_p
    lib.w8_gemv_codes.argtypes = [vp, vp, i64, i64, vp, vp, i64, vp, ctypes.c_int]
    lib.w8_linear.argtypes = [vp, vp, i64, i64, i64, vp, ctypes.c_int, i64, vp, ctypes.c_int, ctypes.c_int]
    lib.w8_linear.restype = ctypes.c_int
    act_sym.bind(lib.w8_act_sym)
    lib.w8_rescale.argtypes = [vp, i64, vp, vp, i64, i64, vp, ctypes.c_int]
    lib.w8_rescale.restype = None


_LIB = KernelLibrary("w8", "w8_gemv.c", _bind)


# library(flags=None): the best build, or one with ``flags`` (e.g. PORTABLE_FLAGS); None if none builds
library, available, _built = _LIB.get, _LIB.available, _LIB.built


@dataclass
class W8GemvPrepared(CachedPointers):
    packed: torch.Tensor  # int8 [out_pad, kp], row-major (torch._int_mm reads it as it is)
    scale: torch.Tensor  # float32 [out_pad] (padded rows: 0)
    n_in: int
    k_pad: int
    out: int
    bias: torch.Tensor | None = None
    method: str = "native"

    def __post_init__(self) -> None:
        # the weight half of w8_linear's arguments, built once (rebuilt by copies and unpickling)
        require_cpu("w8 native kernel", self.packed, self.scale)
        self.args = (self.packed.data_ptr(), self.scale.data_ptr(), self.scale.shape[0], self.k_pad, self.n_in)


def prepare(codes: torch.Tensor, scale: torch.Tensor) -> W8GemvPrepared:
    """INT8 weight codes ``[out, in]`` and per-row scales ``[out]`` → the kernel's layout."""
    if codes.dtype != torch.int8 or codes.dim() != 2:
        raise KernelError(f"w8 native kernel needs int8 codes [out, in], got {codes.dtype} {tuple(codes.shape)}")
    out, n = codes.shape
    if scale.numel() != out:  # the kernel takes its row count from the scales
        raise ValueError(f"w8 native kernel: needs one scale per row ({out}), got {tuple(scale.shape)}")
    scale = scale.reshape(out)
    kp, out_pad = -(-n // CHUNK) * CHUNK, -(-out // 4) * 4
    c = F.pad(codes, (0, kp - n, 0, out_pad - out))
    packed = c.contiguous()
    return W8GemvPrepared(packed, F.pad(scale.float(), (0, out_pad - out)).contiguous(), n, kp, out)


def run(x: torch.Tensor, w: W8GemvPrepared, lib: ctypes.CDLL | None = None) -> torch.Tensor:
    """W8A16: ``x [..., in]`` (float32 or bfloat16; others are converted to float32) → ``[..., out]``
    of x's dtype."""
    lib = _built(lib)
    require_state(w, W8GemvPrepared, "w8 native kernel")
    return a16_linear.call(lib.w8_linear, w.args, w.n_in, w.args[2], w.out, w.bias, x, "w8 native kernel")


def run_codes(codes: torch.Tensor, scale: torch.Tensor, w: W8GemvPrepared, lib: ctypes.CDLL | None = None) -> torch.Tensor:
    """``float(codes [t, in] · weight rows) * (w_scale * scale [t])`` → ``[t, out]`` float32, for
    int8 codes (or int16 ones within the INT8 range, |code| ≤ 128: the int32 row sums stay exact
    up to :data:`MAX_CODES_IN` inputs). Other dtypes are refused: a cast to int16 would wrap or
    truncate them."""
    lib = _built(lib)
    require_state(w, W8GemvPrepared, "w8 native kernel")
    require_cpu("w8 native kernel", codes, scale)
    if codes.dim() != 2 or codes.shape[1] != w.n_in:
        raise ValueError(f"w8 native kernel: codes must be [tokens, {w.n_in}], got {tuple(codes.shape)}")
    if codes.dtype != torch.int8 and codes.dtype != torch.int16:
        raise ValueError(f"w8 native kernel: codes must be int8 (or int16 in the INT8 range), got {codes.dtype}")
    t = codes.shape[0]
    if scale.numel() != t:
        raise ValueError(f"w8 native kernel: scale must hold one value per token ({t}), got {tuple(scale.shape)}")
    xq = F.pad(codes.to(torch.int16), (0, w.k_pad - w.n_in)).contiguous()
    return _gemv_codes(lib, xq, scale.float().contiguous(), w)


def run_int16_codes(codes: torch.Tensor, scale: torch.Tensor, w: W8GemvPrepared, lib: ctypes.CDLL | None = None) -> torch.Tensor:
    """:func:`run_codes` for int16 codes ``[t, in]`` that need no cast: W4A4's outlier channels as
    :mod:`.act_sym` returns them, INT8 values (|code| ≤ 128, what keeps the one int32 sum per row
    exact; int16's full range would wrap from 512 inputs)."""
    lib = _built(lib)
    require_state(w, W8GemvPrepared, "w8 native kernel")
    require_cpu("w8 native kernel", codes, scale)
    if codes.dtype != torch.int16 or codes.dim() != 2 or codes.shape[1] != w.n_in or scale.numel() != codes.shape[0]:
        raise ValueError(f"w8 native kernel: int16 codes [tokens, {w.n_in}] and one scale per token, got "
                         f"{codes.dtype} {tuple(codes.shape)} / {tuple(scale.shape)}")
    xq = codes if w.k_pad == w.n_in else F.pad(codes, (0, w.k_pad - w.n_in))
    return _gemv_codes(lib, xq.contiguous(), scale.float().contiguous(), w)


def _gemv_codes(lib, xq: torch.Tensor, sx: torch.Tensor, w: W8GemvPrepared) -> torch.Tensor:
    if w.k_pad > MAX_CODES_IN:
        raise KernelError(f"w8 native kernel: {w.k_pad} inputs could overflow its int32 row sums of codes "
                          f"(at most {MAX_CODES_IN})")
    t, out_pad = xq.shape[0], w.scale.shape[0]
    y = torch.empty(t, out_pad)
    if t:
        lib.w8_gemv_codes(w.packed.data_ptr(), w.scale.data_ptr(), out_pad, w.k_pad, xq.data_ptr(), sx.data_ptr(),
                          t, y.data_ptr(), torch.get_num_threads())
    return y[:, :w.out] if out_pad != w.out else y


def act_codes(x: torch.Tensor, w: W8GemvPrepared, bits: int, clip: float,
              lib: ctypes.CDLL | None = None, *, half: bool = False) -> act_sym.NativeCodes:
    """Per-token symmetric ``bits``-bit codes of ``x [t, in]`` (:mod:`.native_act`), padded to the
    weight's width: what the GEMV and ``torch._int_mm`` on this layout both read."""
    lib = _built(lib)
    require_state(w, W8GemvPrepared, "w8 native kernel")
    if x.dim() != 2 or x.shape[1] != w.n_in:
        raise ValueError(f"w8 native kernel: activations must be [tokens, {w.n_in}], got {tuple(x.shape)}")
    return act_sym.symmetric_codes(lib.w8_act_sym, x, 0, w.n_in, 1, w.k_pad, bits, clip, half)


def rescale(prod: torch.Tensor, x_scale: torch.Tensor, w: W8GemvPrepared,
            lib: ctypes.CDLL | None = None) -> torch.Tensor:
    """``prod.float() * (x_scale * w.scale)`` for an int32 product ``[t, ≥ out]`` (its first ``out``
    columns) and per-token scales ``[t, 1]``, the same bits in one C pass; ``[t, out]`` float32."""
    lib = _built(lib)
    require_state(w, W8GemvPrepared, "w8 rescale")
    require_cpu("w8 rescale", prod, x_scale)
    t = prod.shape[0]
    if prod.dtype != torch.int32 or prod.dim() != 2 or prod.shape[1] < w.out or prod.stride(1) != 1 \
            or x_scale.numel() != t:
        raise ValueError(f"w8 rescale: needs int32 [{t}, >= {w.out}] and {t} scales, got {prod.dtype} "
                         f"{tuple(prod.shape)} and {x_scale.numel()}")
    sx, sw = x_scale.float().contiguous(), w.scale.float().contiguous()
    y = torch.empty(t, w.out)
    lib.w8_rescale(prod.data_ptr(), prod.stride(0), sx.data_ptr(), sw.data_ptr(), t, w.out, y.data_ptr(),
                   torch.get_num_threads())
    return y


def quantize_and_run(x: torch.Tensor, w: W8GemvPrepared, bits: int, clip: float,
                     lib: ctypes.CDLL | None = None, *, half: bool = False) -> torch.Tensor:
    """W8A8 in two C calls: :func:`act_codes`, then the GEMV; ``[t, out]`` float32 (no bias)."""
    lib = _built(lib)
    c = act_codes(x, w, bits, clip, lib, half=half)
    return _gemv_codes(lib, c.xq, c.scale, w)
