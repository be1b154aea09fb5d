"""lowbit's INT8-weight CPU kernel (``csrc/w8_gemv.c``) for W8A8: the weight stays 1 byte per
value and each (token, row) product is an exact int32 sum (``vpmaddwd`` on sign-extended codes),
rescaled once in float32 by weight scale x activation scale. 4 output rows share every activation
load, 4 tokens share every sign extension.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from . import cbuild
from .params import KernelError

CHUNK = 32  # input channels per 32-byte chunk of codes
PORTABLE_FLAGS = ("-O3", "-DW8_NO_SIMD")


def _bind(lib: ctypes.CDLL) -> None:
    i64, vp = ctypes.c_int64, ctypes.c_void_p
    lib.w8_gemv_codes.argtypes = [vp, vp, i64, i64, vp, vp, i64, vp, ctypes.c_int]


_LIB = cbuild.NativeLibrary(Path(__file__).with_name("csrc") / "w8_gemv.c", cbuild.KERNEL_FLAG_SETS, _bind)


def library(flags: tuple[str, ...] | None = None) -> ctypes.CDLL | None:
    return _LIB.get(flags)


def available() -> bool:
    return library() is not None


@dataclass
class W8GemvPrepared:
    packed: torch.Tensor  # int8 [out_pad / 4, kp / 32, 4, 32]
    scale: torch.Tensor  # float32 [out_pad] (padded rows: 0)
    n_in: int
    k_pad: int
    out: int


def prepare(codes: torch.Tensor, scale: torch.Tensor) -> W8GemvPrepared:
    """INT8 weight codes ``[out, in]`` and per-row scales ``[out]`` → the kernel's layout."""
    if codes.dtype != torch.int8:
        raise KernelError(f"w8 native kernel needs int8 codes, got {codes.dtype}")
    out, n = codes.shape
    kp, out_pad = -(-n // CHUNK) * CHUNK, -(-out // 4) * 4
    c = F.pad(codes, (0, kp - n, 0, out_pad - out))
    packed = c.reshape(out_pad // 4, 4, kp // CHUNK, CHUNK).transpose(1, 2).contiguous()
    return W8GemvPrepared(packed, F.pad(scale.float(), (0, out_pad - out)).contiguous(), n, kp, out)


def run_codes(codes: torch.Tensor, scale: torch.Tensor, w: W8GemvPrepared, lib: ctypes.CDLL | None = None) -> torch.Tensor:
    """``float(codes [t, in] · weight rows) * (w_scale * scale [t])`` → ``[t, out]`` float32."""
    lib = lib or library()
    if lib is None:
        raise KernelError("w8 native kernel: no C compiler could build it")
    t = codes.shape[0]
    xq = F.pad(codes.to(torch.int16), (0, w.k_pad - w.n_in)).contiguous()
    sx = scale.float().contiguous()
    out_pad = w.scale.shape[0]
    y = torch.empty(t, out_pad)
    if t:
        lib.w8_gemv_codes(w.packed.data_ptr(), w.scale.data_ptr(), out_pad, w.k_pad, xq.data_ptr(), sx.data_ptr(),
                          t, y.data_ptr(), torch.get_num_threads())
    return y[:, :w.out] if out_pad != w.out else y
