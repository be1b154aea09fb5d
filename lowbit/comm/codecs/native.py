"""The fused C encoder/decoder for CPU tensors, built on first use with the system C compiler.

Built by :mod:`lowbit.kernels.cbuild` (``cc -O3 -march=native``, cached per sources, flags,
compiler and CPU; loaded with ctypes). If the compiler rejects -march=native, plain -O3 is used;
both builds write the same bits (tested). With AVX2 + F16C the kernel uses the intrinsics in
``csrc/qr_avx2.h``. If no compiler is found, or LOWBIT_QR_NATIVE=0, ``available()`` is False and
the vectorised torch code (``fast.py``) runs.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import torch

from lowbit.kernels import cbuild

_SRC = Path(__file__).with_name("csrc") / "qr_codec.c"
_FLAG_SETS = (("-O3", "-march=native"), ("-O3",))
PORTABLE_FLAGS = ("-O3", "-DQR_NO_SIMD")  # the plain C loops, no intrinsics (tests compare it)
_IN_TYPES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


def _bind(lib: ctypes.CDLL) -> None:
    i64, vp = ctypes.c_int64, ctypes.c_void_p
    lib.qr_encode.argtypes = [vp, ctypes.c_int, i64, i64, ctypes.c_int, ctypes.c_int, vp, i64, i64]
    lib.qr_decode.argtypes = [vp, i64, ctypes.c_int, ctypes.c_int, i64, i64, vp, i64, ctypes.c_int, ctypes.c_int]
    lib.qr_reduce.argtypes = [vp, ctypes.c_int, i64, ctypes.c_int, ctypes.c_int, i64, i64, ctypes.c_float, vp]


_LIB = cbuild.NativeLibrary(_SRC, _FLAG_SETS, _bind)
_lib: ctypes.CDLL | None = None


def variant(flags: tuple[str, ...]) -> ctypes.CDLL | None:
    """The kernel built with other flags (e.g. PORTABLE_FLAGS), for tests and benchmarks; None if it fails."""
    return _LIB.get(tuple(flags))


def available() -> bool:
    global _lib
    if os.environ.get("LOWBIT_QR_NATIVE", "1") == "0":
        return False
    _lib = _LIB.get()
    return _lib is not None


def simd() -> bool:
    """Whether the loaded kernel uses the AVX2/F16C intrinsics."""
    return available() and bool(_lib.qr_has_simd())


def encode_rows(x: torch.Tensor, kind: int, bits: int, rows: int, row_bytes: int, code_bytes: int,
                out: torch.Tensor | None = None, lib: ctypes.CDLL | None = None) -> torch.Tensor:
    """x: contiguous flat CPU tensor (f32/bf16/f16); rows beyond x are zero padded. ``out``: a
    contiguous uint8 [rows, row_bytes] buffer to write into (else a new one). ``lib``: another build."""
    if out is None:
        out = torch.empty(rows, row_bytes, dtype=torch.uint8)
    if rows:
        (lib or _lib).qr_encode(x.data_ptr(), _IN_TYPES[x.dtype], x.numel(), rows, kind, bits, out.data_ptr(), row_bytes,
                                code_bytes)
    return out


def decode_rows(wire: torch.Tensor, kind: int, bits: int, row_bytes: int, code_bytes: int, n: int,
                dtype: torch.dtype = torch.float32, out: torch.Tensor | None = None, accumulate: bool = False,
                lib: ctypes.CDLL | None = None) -> torch.Tensor:
    """The first n values as ``dtype`` (written into the contiguous flat ``out`` when given;
    ``accumulate`` adds into a float32 ``out``)."""
    rows = wire.shape[0]
    if out is None:
        out = torch.empty(n, dtype=dtype)
    if accumulate and out.dtype != torch.float32:
        raise TypeError("accumulate needs a float32 output")
    if rows and n:
        (lib or _lib).qr_decode(wire.data_ptr(), rows, kind, bits, row_bytes, code_bytes, out.data_ptr(), n,
                                int(accumulate), _IN_TYPES[out.dtype])
    return out


def reduce_rows(wires: list[torch.Tensor], kind: int, bits: int, row_bytes: int, code_bytes: int, clamp: float,
                out: torch.Tensor, lib: ctypes.CDLL | None = None) -> torch.Tensor:
    """Fused decode + sum (in list order) + clamp (``clamp`` > 0) + encode of contiguous
    ``[rows, row_bytes]`` wires into the contiguous ``out`` of the same shape."""
    rows = out.shape[0]
    ptrs = (ctypes.c_void_p * len(wires))(*[w.data_ptr() for w in wires])
    if rows:
        (lib or _lib).qr_reduce(ptrs, len(wires), rows, kind, bits, row_bytes, code_bytes, float(clamp), out.data_ptr())
    return out
