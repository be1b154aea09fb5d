"""The fused C encoder/decoder for CPU tensors, built on first use with the system C compiler.

Loaded through ctypes (no torch headers, no ninja): ``cc -O3 -shared -fPIC`` into the lowbit
cache, keyed by a hash of the source and flags. If no compiler is found, or LOWBIT_QR_NATIVE=0,
``available()`` is False and the vectorised torch code (``fast.py``) runs instead.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
from pathlib import Path

import torch

_SRC = Path(__file__).with_name("csrc") / "qr_codec.c"
_FLAG_SETS = (["-O3", "-march=native"], ["-O3"])
_lib: ctypes.CDLL | None = None
_tried = False
_IN_TYPES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


def _cache_dir() -> Path:
    return Path(os.environ.get("LOWBIT_CACHE", Path.home() / ".cache" / "lowbit")) / "native"


def _build() -> ctypes.CDLL | None:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        return None
    src = _SRC.read_bytes()
    for flags in _FLAG_SETS:
        key = hashlib.sha256(src + " ".join(flags).encode() + platform.machine().encode() + cc.encode()).hexdigest()[:16]
        so = _cache_dir() / f"qr_codec_{key}.so"
        if not so.exists():
            so.parent.mkdir(parents=True, exist_ok=True)
            tmp = so.with_name(so.name + f".tmp{os.getpid()}")
            r = subprocess.run([cc, *flags, "-shared", "-fPIC", str(_SRC), "-o", str(tmp), "-lm"], capture_output=True)
            if r.returncode != 0:
                continue
            os.replace(tmp, so)
        try:
            lib = ctypes.CDLL(str(so))
        except OSError:
            continue
        i64, vp = ctypes.c_int64, ctypes.c_void_p
        lib.qr_encode.argtypes = [vp, ctypes.c_int, i64, i64, ctypes.c_int, ctypes.c_int, vp, i64, i64]
        lib.qr_decode.argtypes = [vp, i64, ctypes.c_int, ctypes.c_int, i64, i64, vp, i64, ctypes.c_int, ctypes.c_int]
        return lib
    return None


def available() -> bool:
    global _lib, _tried
    if os.environ.get("LOWBIT_QR_NATIVE", "1") == "0":
        return False
    if not _tried:
        _tried = True
        _lib = _build()
    return _lib is not None


def encode_rows(x: torch.Tensor, kind: int, bits: int, rows: int, row_bytes: int, code_bytes: int,
                out: torch.Tensor | None = None) -> torch.Tensor:
    """x: contiguous flat CPU tensor (f32/bf16/f16); rows beyond x are zero padded. ``out``: a
    contiguous uint8 [rows, row_bytes] buffer to write into (else a new one)."""
    if out is None:
        out = torch.empty(rows, row_bytes, dtype=torch.uint8)
    if rows:
        _lib.qr_encode(x.data_ptr(), _IN_TYPES[x.dtype], x.numel(), rows, kind, bits, out.data_ptr(), row_bytes, code_bytes)
    return out


def decode_rows(wire: torch.Tensor, kind: int, bits: int, row_bytes: int, code_bytes: int, n: int,
                dtype: torch.dtype = torch.float32, out: torch.Tensor | None = None, accumulate: bool = False) -> torch.Tensor:
    """The first n values as ``dtype`` (written into the contiguous flat ``out`` when given;
    ``accumulate`` adds into a float32 ``out``)."""
    rows = wire.shape[0]
    if out is None:
        out = torch.empty(n, dtype=dtype)
    if accumulate and out.dtype != torch.float32:
        raise TypeError("accumulate needs a float32 output")
    if rows and n:
        _lib.qr_decode(wire.data_ptr(), rows, kind, bits, row_bytes, code_bytes, out.data_ptr(), n, int(accumulate),
                       _IN_TYPES[out.dtype])
    return out
