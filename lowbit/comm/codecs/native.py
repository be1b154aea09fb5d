"""The fused C encoder/decoder for CPU tensors, built on first use with the system C compiler.

Loaded through ctypes (no torch headers, no ninja): ``cc -O3 -march=native -shared -fPIC`` into
the lowbit cache, keyed by a hash of the sources, the flags, the compiler and this CPU's feature
flags (a cache shared between machines never hands one CPU another's instructions). If the
compiler rejects -march=native, plain -O3 is used; both builds write the same bits (tested). With
AVX2 + F16C the kernel uses the intrinsics in ``csrc/qr_avx2.h``. If no compiler is found, or
LOWBIT_QR_NATIVE=0, ``available()`` is False and the vectorised torch code (``fast.py``) runs.
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

_CSRC = Path(__file__).with_name("csrc")
_SRC = _CSRC / "qr_codec.c"
_FLAG_SETS = (("-O3", "-march=native"), ("-O3",))
PORTABLE_FLAGS = ("-O3", "-DQR_NO_SIMD")  # the plain C loops, no intrinsics (tests compare it)
_lib: ctypes.CDLL | None = None
_tried = False
_variants: dict[tuple[str, ...], ctypes.CDLL | None] = {}
_IN_TYPES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


def _cache_dir() -> Path:
    return Path(os.environ.get("LOWBIT_CACHE", Path.home() / ".cache" / "lowbit")) / "native"


def _cpu_id() -> bytes:
    """This CPU's model and feature flags (Linux), so -march=native builds are per CPU."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor().encode()
    keep = [ln for ln in text.splitlines() if ln.startswith(("flags", "model name", "Features", "CPU part"))]
    return "\n".join(sorted(set(keep))).encode()


def _sources() -> bytes:
    return b"".join(p.name.encode() + p.read_bytes() for p in sorted(_CSRC.glob("*.[ch]")))


def _compile(cc: str, flags: tuple[str, ...]) -> ctypes.CDLL | None:
    key_src = _sources() + " ".join(flags).encode() + platform.machine().encode() + cc.encode() + _cpu_id()
    so = _cache_dir() / f"qr_codec_{hashlib.sha256(key_src).hexdigest()[:16]}.so"
    if not so.exists():
        so.parent.mkdir(parents=True, exist_ok=True)
        tmp = so.with_name(so.name + f".tmp{os.getpid()}")
        try:
            r = subprocess.run([cc, *flags, "-shared", "-fPIC", str(_SRC), "-o", str(tmp), "-lm"], capture_output=True)
            if r.returncode != 0:
                return None
            os.replace(tmp, so)
        finally:
            tmp.unlink(missing_ok=True)
    try:
        lib = ctypes.CDLL(str(so))
    except OSError:
        return None
    i64, vp = ctypes.c_int64, ctypes.c_void_p
    lib.qr_encode.argtypes = [vp, ctypes.c_int, i64, i64, ctypes.c_int, ctypes.c_int, vp, i64, i64]
    lib.qr_decode.argtypes = [vp, i64, ctypes.c_int, ctypes.c_int, i64, i64, vp, i64, ctypes.c_int, ctypes.c_int]
    lib.qr_reduce.argtypes = [vp, ctypes.c_int, i64, ctypes.c_int, ctypes.c_int, i64, i64, ctypes.c_float, vp]
    return lib


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def _build() -> ctypes.CDLL | None:
    cc = _compiler()
    if not cc:
        return None
    for flags in _FLAG_SETS:
        lib = _compile(cc, flags)
        if lib is not None:
            return lib
    return None


def variant(flags: tuple[str, ...]) -> ctypes.CDLL | None:
    """The kernel built with other flags (e.g. PORTABLE_FLAGS), for tests and benchmarks; None if it fails."""
    if flags not in _variants:
        cc = _compiler()
        _variants[flags] = _compile(cc, tuple(flags)) if cc else None
    return _variants[flags]


def available() -> bool:
    global _lib, _tried
    if os.environ.get("LOWBIT_QR_NATIVE", "1") == "0":
        return False
    if not _tried:
        _tried = True
        _lib = _build()
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
