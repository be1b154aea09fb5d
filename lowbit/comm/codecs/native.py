"""The fused C encoder/decoder for CPU tensors, built on first use with the system C compiler.

Built by :mod:`lowbit.native.cbuild` (``cc -O3 -march=native``, cached per sources, flags,
compiler and CPU; loaded with ctypes). If the compiler rejects -march=native, plain -O3 is used;
both builds write the same bits (tested). With AVX2 + F16C the kernel uses the intrinsics in
``csrc/qr_avx2.h``, on AVX-512 builds also those in ``csrc/qr_avx512.h``. If no compiler is
found, or LOWBIT_QR_NATIVE=0, ``available()`` is False and the vectorised torch code
(``fast.py``) runs.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import torch

from lowbit.native import cbuild, isa

_SRC = Path(__file__).with_name("csrc") / "qr_codec.c"

def _flag_sets() -> tuple[tuple[str, ...], ...]:
    """This CPU's ISA variant, then narrower ones (lowbit.native.isa); the codecs run no threads."""
    return isa.flag_sets(())


PORTABLE_FLAGS = ("-O3", "-DQR_NO_SIMD")  # the plain C loops, no intrinsics (tests compare it)
_IN_TYPES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


def _bind(lib: ctypes.CDLL) -> None:
    i64, vp, ci = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
    lib.qr_encode.argtypes = [vp, ci, i64, i64, ci, ci, vp, i64, i64, i64]
    lib.qr_encode.restype = ci
    lib.qr_decode.argtypes = [vp, i64, ci, ci, i64, i64, vp, i64, ci, ci, i64, i64]
    lib.qr_decode.restype = ci
    lib.qr_reduce.argtypes = [vp, ci, i64, ci, ci, i64, i64, ctypes.c_float, vp, ctypes.POINTER(i64), i64]
    lib.qr_reduce.restype = ci
    lib.qr_split.argtypes = [vp, ci, i64, i64, vp, i64, ci, ctypes.c_float, vp, vp]
    lib.qr_split.restype = ci
    lib.qr_merge.argtypes = [vp, i64, i64, vp, i64, ci, ctypes.c_float, vp, vp, ci]
    lib.qr_merge.restype = ci
    lib.qr_encode_split.argtypes = [vp, ci, i64, i64, vp, i64, ci, ctypes.c_float, vp, i64, ci, ci, vp, i64, i64, i64]
    lib.qr_encode_split.restype = ci
    lib.qr_decode_merge.argtypes = [vp, ci, i64, ci, ci, i64, i64, ctypes.POINTER(i64), i64, i64, vp, i64, ci,
                                    ctypes.c_float, vp, vp, ci]
    lib.qr_decode_merge.restype = ci
    lib.qr_set_divide_codes.argtypes = [ci]
    lib.qr_set_divide_codes.restype = None
    lib.qr_set_divide_codes(int(divide_codes()))


def divide_codes() -> bool:
    """Whether the AVX-512 integer codes divide (AMD, whose divider outpaces the reciprocal's extra
    operations: measured on Zen 4) or multiply by the block's reciprocal (elsewhere: Intel's 512-bit
    divide takes twice its 256-bit one, the same rate per lane, so wider vectors do not speed it up).
    The same bits either way; LOWBIT_QR_DIVIDE=0/1 overrides (benchmarks)."""
    env = os.environ.get("LOWBIT_QR_DIVIDE")
    if env in ("0", "1"):
        return env == "1"
    if env:
        raise ValueError(f"LOWBIT_QR_DIVIDE={env!r}: use 0 or 1")
    from lowbit.native.cpu_features import cpu_info

    return cpu_info().get("vendor") == "AuthenticAMD"


def set_divide_codes(on: bool, lib: ctypes.CDLL | None = None) -> None:
    """Switch how a loaded build computes its AVX-512 integer codes (tests compare both)."""
    _built(lib).qr_set_divide_codes(int(on))


_LIB = cbuild.NativeLibrary(_SRC, _flag_sets, _bind)
_lib: ctypes.CDLL | None = None


def _built(lib: ctypes.CDLL | None) -> ctypes.CDLL:
    """``lib``, else the best build (whether or not :func:`available` was asked first)."""
    lib = lib or _LIB.get()
    if lib is None:
        raise ValueError("the all-reduce codecs' C kernel could not be built here (no C compiler?)")
    return lib


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
    return simd_width() > 0


def simd_width() -> int:
    """512 when the loaded kernel also has the AVX-512 steps, 256 with AVX2/F16C only, 0 otherwise."""
    return int(_lib.qr_has_simd()) if available() else 0


def _bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _check_rows(t: torch.Tensor, what: str, rows: int | None, row_bytes: int) -> int:
    """``t`` must be a contiguous CPU uint8 ``[rows, row_bytes]`` buffer; returns its rows."""
    if t.dtype != torch.uint8 or t.device.type != "cpu" or not t.is_contiguous() or t.dim() != 2:
        raise ValueError(f"{what}: needs a contiguous CPU uint8 [rows, {row_bytes}] tensor, got "
                         f"{t.dtype} {tuple(t.shape)} on {t.device}{'' if t.is_contiguous() else ', not contiguous'}")
    if t.shape[1] != row_bytes or (rows is not None and t.shape[0] != rows):
        want = f"[{'rows' if rows is None else rows}, {row_bytes}]"
        raise ValueError(f"{what}: has shape {tuple(t.shape)}, this wire needs {want}")
    return t.shape[0]


def _check_values(t: torch.Tensor, what: str) -> None:
    if t.dtype not in _IN_TYPES or t.device.type != "cpu" or not t.is_contiguous():
        raise ValueError(f"{what}: needs a contiguous CPU float32/bfloat16/float16 tensor, got {t.dtype} on "
                         f"{t.device}{'' if t.is_contiguous() else ', not contiguous'}")


def _call(fn, *args) -> None:
    if fn(*args) != 0:  # the C side's own check; unreachable after the wrapper's
        raise ValueError(f"{fn.__name__}: the C kernel refused its arguments (buffer sizes or wire layout)")


def encode_rows(x: torch.Tensor, kind: int, bits: int, rows: int, row_bytes: int, code_bytes: int,
                out: torch.Tensor | None = None, lib: ctypes.CDLL | None = None) -> torch.Tensor:
    """x: contiguous flat CPU tensor (f32/bf16/f16); rows beyond x are zero padded. ``out``: a
    contiguous uint8 [rows, row_bytes] buffer to write into (else a new one). ``lib``: another build."""
    _check_values(x, "encode input")
    if rows < 0 or rows * 2048 < x.numel():
        raise ValueError(f"encode: {rows} rows of 2048 values cannot hold the input's {x.numel()} values")
    if out is None:
        out = torch.empty(rows, row_bytes, dtype=torch.uint8)
    _check_rows(out, "encode out", rows, row_bytes)
    if rows:
        _call(_built(lib).qr_encode, x.data_ptr(), _IN_TYPES[x.dtype], x.numel(), rows, kind, bits, out.data_ptr(),
              row_bytes, code_bytes, _bytes(out))
    return out


def decode_rows(wire: torch.Tensor, kind: int, bits: int, row_bytes: int, code_bytes: int, n: int,
                dtype: torch.dtype = torch.float32, out: torch.Tensor | None = None, accumulate: bool = False,
                lib: ctypes.CDLL | None = None) -> torch.Tensor:
    """The first n values as ``dtype`` (written into the contiguous flat ``out`` when given;
    ``accumulate`` adds into a float32 ``out``). ValueError when n exceeds what the wire holds."""
    rows = _check_rows(wire, "decode wire", None, row_bytes)
    if not 0 <= n <= rows * 2048:
        raise ValueError(f"decode: n = {n} values, the wire holds {rows} rows = {rows * 2048} values")
    if out is None:
        out = torch.empty(n, dtype=dtype)
    _check_values(out, "decode out")
    if accumulate and out.dtype != torch.float32:
        raise TypeError("accumulate needs a float32 output")
    if out.numel() < n:
        raise ValueError(f"decode: out holds {out.numel()} values, n = {n}")
    if rows and n:
        _call(_built(lib).qr_decode, wire.data_ptr(), rows, kind, bits, row_bytes, code_bytes, out.data_ptr(), n,
              int(accumulate), _IN_TYPES[out.dtype], _bytes(wire), out.numel())
    return out


def reduce_rows(wires: list[torch.Tensor], kind: int, bits: int, row_bytes: int, code_bytes: int, clamp: float,
                out: torch.Tensor, lib: ctypes.CDLL | None = None) -> torch.Tensor:
    """Fused decode + sum (in list order) + float16 bounding (``clamp`` > 0) + encode of contiguous
    ``[rows, row_bytes]`` wires into the contiguous ``out`` of the same shape."""
    if not wires:
        raise ValueError("reduce: needs at least one wire")
    rows = _check_rows(out, "reduce out", None, row_bytes)
    for j, w in enumerate(wires):
        _check_rows(w, f"reduce wire {j}", rows, row_bytes)
    ptrs = (ctypes.c_void_p * len(wires))(*[w.data_ptr() for w in wires])
    sizes = (ctypes.c_int64 * len(wires))(*[_bytes(w) for w in wires])
    if rows:
        _call(_built(lib).qr_reduce, ptrs, len(wires), rows, kind, bits, row_bytes, code_bytes, float(clamp),
              out.data_ptr(), sizes, _bytes(out))
    return out


def split_channels(x: torch.Tensor, hidden: int, chans: torch.Tensor, nch: int, block: int, scale: float,
                   rest: torch.Tensor | None = None, outl: torch.Tensor | None = None,
                   lib: ctypes.CDLL | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(float32 rest [tokens, hidden], outliers [tokens, nch] in x's dtype) of the contiguous CPU
    message x (``channels.ChannelPlan.split``), written into ``rest`` / ``outl`` when given (kept
    buffers: a fresh large one costs page faults); ``chans``: the sorted distinct int64 channels."""
    _check_values(x, "split input")
    _check_chans(chans, hidden, nch, x.numel())
    tokens = x.numel() // hidden
    rest = torch.empty(tokens, hidden, dtype=torch.float32) if rest is None else rest
    outl = torch.empty(tokens, nch, dtype=x.dtype) if outl is None else outl
    for t, shape, dt, what in ((rest, (tokens, hidden), torch.float32, "rest"), (outl, (tokens, nch), x.dtype, "outl")):
        if tuple(t.shape) != shape or t.dtype != dt or not t.is_contiguous() or t.device.type != "cpu":
            raise ValueError(f"split: {what} must be a contiguous CPU {dt} tensor of shape {shape}")
    _call(_built(lib).qr_split, x.data_ptr(), _IN_TYPES[x.dtype], x.numel(), hidden, chans.data_ptr(), nch, block,
          scale, outl.data_ptr(), rest.data_ptr())
    return rest, outl


def encode_split(x: torch.Tensor, hidden: int, chans: torch.Tensor, nch: int, block: int, scale: float,
                 kind: int, bits: int, row_bytes: int, code_bytes: int, out: torch.Tensor, outl: torch.Tensor,
                 lib: ctypes.CDLL | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`split_channels` and the codec fused per row (quantized kinds): the wire ``out``
    ``[rows, row_bytes]`` and the outlier channels ``outl`` ``[tokens, nch]`` in x's dtype."""
    _check_values(x, "encode input")
    _check_chans(chans, hidden, nch, x.numel())
    tokens = x.numel() // hidden
    rows = _check_rows(out, "encode out", -(-x.numel() // 2048), row_bytes)
    if tuple(outl.shape) != (tokens, nch) or outl.dtype != x.dtype or not outl.is_contiguous() or outl.device.type != "cpu":
        raise ValueError(f"encode_split: outl must be a contiguous CPU {x.dtype} tensor of shape {(tokens, nch)}")
    if kind > 1:
        raise ValueError("encode_split: only the quantized codecs (int, fp4) take outlier channels / block Hadamard")
    _call(_built(lib).qr_encode_split, x.data_ptr(), _IN_TYPES[x.dtype], x.numel(), hidden, chans.data_ptr(), nch,
          block, scale, outl.data_ptr(), rows, kind, bits, out.data_ptr(), row_bytes, code_bytes, _bytes(out))
    return out, outl


def merge_channels(rest: torch.Tensor, hidden: int, chans: torch.Tensor, nch: int, block: int, scale: float,
                   osum: torch.Tensor | None, out: torch.Tensor, lib: ctypes.CDLL | None = None) -> torch.Tensor:
    """``out`` (contiguous CPU, any float dtype) = the transformed float32 ``rest`` with the float32
    outlier sums ``osum`` [tokens, nch] put back (``channels.ChannelPlan.merge``)."""
    if rest.dtype != torch.float32 or rest.device.type != "cpu" or not rest.is_contiguous():
        raise ValueError("merge: the rest must be a contiguous CPU float32 tensor")
    _check_values(out, "merge out")
    _check_chans(chans, hidden, nch, rest.numel())
    if out.numel() != rest.numel():
        raise ValueError(f"merge: out holds {out.numel()} values, the rest {rest.numel()}")
    _check_osum(osum, rest.numel() // hidden, nch, "merge")
    _call(_built(lib).qr_merge, rest.data_ptr(), rest.numel(), hidden, chans.data_ptr(), nch, block, scale,
          osum.data_ptr() if nch else None, out.data_ptr(), _IN_TYPES[out.dtype])
    return out


def decode_merge_channels(wires: list[torch.Tensor], kind: int, bits: int, row_bytes: int, code_bytes: int,
                          hidden: int, chans: torch.Tensor, nch: int, block: int, scale: float,
                          osum: torch.Tensor | None, out: torch.Tensor, lib: ctypes.CDLL | None = None) -> torch.Tensor:
    """``out`` = :func:`merge_channels` of the float32 sum (list order) of the decoded ``wires``
    (contiguous ``[rows, row_bytes]``, float32-wire rows), fused per row: the one-shot all-reduce's
    local step with a channel plan, the same bits as decode, decode(accumulate)..., then merge."""
    if not wires:
        raise ValueError("decode_merge: needs at least one wire")
    _check_values(out, "decode_merge out")
    n = out.numel()
    rows = _check_rows(wires[0], "decode_merge wire 0", None, row_bytes)
    for j, w in enumerate(wires):
        _check_rows(w, f"decode_merge wire {j}", rows, row_bytes)
    if n > rows * 2048:
        raise ValueError(f"decode_merge: out holds {n} values, the wires {rows} rows = {rows * 2048} values")
    _check_chans(chans, hidden, nch, n)
    _check_osum(osum, n // hidden, nch, "decode_merge")
    ptrs = (ctypes.c_void_p * len(wires))(*[w.data_ptr() for w in wires])
    sizes = (ctypes.c_int64 * len(wires))(*[_bytes(w) for w in wires])
    if n:
        _call(_built(lib).qr_decode_merge, ptrs, len(wires), rows, kind, bits, row_bytes, code_bytes, sizes, n, hidden,
              chans.data_ptr(), nch, block, scale, osum.data_ptr() if nch else None, out.data_ptr(), _IN_TYPES[out.dtype])
    return out


def _check_osum(osum: torch.Tensor | None, tokens: int, nch: int, what: str) -> None:
    """With outlier channels, ``osum`` must be their contiguous float32 CPU sums ``[tokens, nch]``."""
    if nch and (not isinstance(osum, torch.Tensor) or osum.dtype != torch.float32 or osum.device.type != "cpu"
                or not osum.is_contiguous() or tuple(osum.shape) != (tokens, nch)):
        got = f"{osum.dtype} {tuple(osum.shape)} on {osum.device}" if isinstance(osum, torch.Tensor) else repr(osum)
        raise ValueError(f"{what}: needs contiguous float32 CPU outlier sums [{tokens}, {nch}], got {got}")


def _check_chans(chans: torch.Tensor, hidden: int, nch: int, n: int) -> None:
    if chans.dtype != torch.int64 or not chans.is_contiguous() or chans.numel() != nch or chans.device.type != "cpu":
        raise ValueError(f"outlier channels must be a contiguous CPU int64 tensor of {nch} values")
    if n % hidden or (nch and (int(chans.min()) < 0 or int(chans.max()) >= hidden or bool((chans[1:] <= chans[:-1]).any()))):
        raise ValueError(f"{n} values are not whole tokens of {hidden}, or the channels are not sorted, distinct, "
                         f"in [0, {hidden})")
