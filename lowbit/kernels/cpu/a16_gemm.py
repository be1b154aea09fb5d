"""lowbit's batched W4A16 / W8A16 CPU kernel (``csrc/a16_gemm.c``): the GEMV kernels' int16
arithmetic (:mod:`.w4_gemv`, :mod:`.w8_gemv`) over register tiles of 4 tokens x 32 rows (AVX-512;
3 x 8 with AVX2), each weight vector unpacked once per tile instead of once per token and row;
from 8 tokens on AMX CPUs, int8 tiles over each int16 code's two bytes (``csrc/a16_amx.h``).
bfloat16 calls of many tokens multiply the weight unpacked to bfloat16, as GPU W4A16 kernels and
llama.cpp's batched path do: in C on AMX-BF16 tiles (``csrc/a16_amx_bf16.h``, :data:`AMX_BF16_TOKENS`)
or, on AVX512_BF16 CPUs without them, with its dot products (``csrc/a16_dpbf16.h``,
:data:`DPBF16_TOKENS`), and from :data:`BF16_MIN_TOKENS` (or the tiles' upper end) with torch's
bfloat16 matmul on other CPUs that have one (:func:`run`): a token's bits then depend on its call's
size.

Activations are rounded to int16 per group exactly as the GEMVs round them, and each (token, row,
group) product is the same exact int32 with the same float32 steps, so the results are the GEMVs'
bits (tested), with their error bounds: W4A16 within Σ_g (s_g/2)·Σ|w| + 2^-20·Σ|x||w|, W8A16 the
same per block of 256 channels (s_g = absmax/32767 of the group or block).

Layout: the row panels of :mod:`.i8_gemm` (unsigned 4-bit codes, or INT8 codes + 128), with
scales and zero points per (row, group) as ``[out/16, groups, 16]``.
"""

from __future__ import annotations

import ctypes
import functools
import threading
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from lowbit.kernels.cpu import a16_linear, i8_gemm, w4_gemv
from lowbit.kernels.cpu.kernel_library import KernelLibrary
from lowbit.kernels.cpu.method_choice import onednn_cap
from lowbit.kernels.cpu.native_args import CachedPointers, require_cpu, require_state
from lowbit.kernels.linear_params import KernelError, LinearParams
from lowbit.native.cpu_features import cpu_info

PORTABLE_FLAGS = ("-O3", "-DPANEL_NO_SIMD")
# bfloat16 calls of this many tokens run on torch's bfloat16 matmul, W4A16 / W8A16, in builds with
# neither bfloat16 product path below (with AMX-BF16 tiles from their upper end; with AVX512_BF16
# dot products never). Measured before either existed: the weight unpacked once to bfloat16 (about
# 0.25 ns a value on 2 threads) plus the matmul beat the integer tiles (AMX Xeon, 2 threads,
# interleaved medians: 4096² 7.9 against 9.7 ms at 128 tokens for W4A16, 10.1 against 10.4 ms at
# 256 for W8A16, which ties at 128; 3072x576 alike)
BF16_MIN_TOKENS = {True: 128, False: 256}
# bfloat16 calls of [lo, hi) tokens, W4A16 / W8A16, run on AMX-BF16 tiles where the build has them
# (amx_bf16), and from hi on the bfloat16 matmul. Side by side, 1 thread, AMX Xeon, the default
# model's four shapes and 4096² (docs/measurements/a16_bf16_tiles_xeon_amx_1thread_2026-12-03.json):
# W4A16 g64 1.09-1.90x the path before from 32 to 256 tokens (4096² up to 4.4x), 0.77-1.03x at 511
# on the 576-wide shapes; W8A16's exact int8 tiles stay ahead below 128 tokens (0.59-0.92x at 32-64),
# the bfloat16 tiles 1.07-1.61x from 128 to 256. Up to 640 since the matmul path's weight goes into a
# reused buffer (_weight_scratch), 2 threads, interleaved medians of 11: at 512 tokens the tiles ran
# 0.90-1.24x the matmul path over the same five shapes (two runs; 1 thread 1.06-1.32x), at 768
# 0.71-1.32x (4096² 0.72-0.78x)
AMX_BF16_TOKENS = {True: (32, 640), False: (128, 640)}
# bfloat16 calls of this many tokens and more, W4A16 / W8A16, run on AVX512_BF16 dot products where
# the build has them and no AMX-BF16 tiles (dpbf16). Side by side, 2 threads, AMD Zen 4, interleaved
# medians of 7, the default model's four shapes and 4096² (scripts/a16_bf16_paths.py;
# docs/measurements/a16_bf16_paths_{w4a16,w8a16}_epyc_zen4_2026-12-05.json), W4A16 / W8A16: against
# the exact int16 tiles 0.88-1.24x / 0.90-1.24x at 16 tokens, 0.99-1.43x / 0.99-1.32x at 32, 1.04-1.58x
# / 1.04-1.53x at 64, 1.05-1.94x / 1.13-1.83x from 128 on; against the weight unpacked into memory and
# torch's matmul 1.11-1.43x / 1.10-1.46x at 512 and 2048 tokens (1.3-3.7x below), so no upper end
DPBF16_TOKENS = {True: 32, False: 32}
NO_END = 1 << 62
W8_BLOCK = 256  # W8A16's activation blocks, as the 8-bit GEMV's (its int32 sums cannot overflow)


def _bind(lib: ctypes.CDLL) -> None:
    i64, vp, ci = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
    lib.a16_gemm_linear.argtypes = [vp, ci, vp, vp, i64, i64, i64, i64, i64, vp, ci, i64, vp, ci, ci]
    lib.a16_gemm_linear.restype = ci
    lib.a16_gemm_simd.restype = ci
    lib.a16_gemm_amx.restype = ci
    lib.a16_gemm_amx_bf16.restype = ci
    lib.a16_gemm_dpbf16.restype = ci
    for f in (lib.a16_gemm_bf16_linear, lib.a16_gemm_dpbf16_linear):
        f.argtypes, f.restype = lib.a16_gemm_linear.argtypes, ci
    lib.a16_gemm_dequant.argtypes = [vp, ci, vp, vp, i64, i64, i64, i64, i64, i64, vp, ci]
    lib.a16_gemm_dequant.restype = None


_LIB = KernelLibrary("a16 gemm", "a16_gemm.c", _bind)

# library(flags=None): the best build, or one with ``flags`` (e.g. PORTABLE_FLAGS); None if none builds
library, available, _built = _LIB.get, _LIB.available, _LIB.built


def simd(lib: ctypes.CDLL | None = None) -> int:
    """0 (portable loop), 256 or 512 (vector width), +1 with VNNI (``vpdpwssd``)."""
    lib = lib or library()
    return 0 if lib is None else int(lib.a16_gemm_simd())


def amx(lib: ctypes.CDLL | None = None) -> bool:
    """Whether this build runs AMX-INT8 tiles from 8 tokens on (the ``amx`` ISA variant, on a CPU
    whose OS granted tile state): each int16 code split into its signed high and unsigned low byte,
    two exact tile products per group, the same integers and so the same bits."""
    lib = lib or library()
    return lib is not None and bool(lib.a16_gemm_amx())


def amx_bf16(lib: ctypes.CDLL | None = None) -> bool:
    """Whether this build runs bfloat16 calls of :data:`AMX_BF16_TOKENS` tokens on AMX-BF16 tiles
    (``csrc/a16_amx_bf16.h``): the weight unpacked to bfloat16 per work item, the activations
    multiplied as they are, float32 sums."""
    lib = lib or library()
    return lib is not None and bool(lib.a16_gemm_amx_bf16())


def bf16_products(nibbles: bool, lib: ctypes.CDLL | None = None) -> tuple[int, int] | None:
    """The tokens [lo, hi) of the bfloat16 calls this build multiplies as bfloat16 in C: AMX-BF16
    tiles (:data:`AMX_BF16_TOKENS`), else AVX512_BF16 dot products (:data:`DPBF16_TOKENS`, no end);
    None where it has neither."""
    if amx_bf16(lib):
        return AMX_BF16_TOKENS[nibbles]
    return (DPBF16_TOKENS[nibbles], NO_END) if dpbf16(lib) else None


def bf16_calls(nibbles: bool, lib: ctypes.CDLL | None = None) -> str:
    """In words, what a bfloat16 call of many tokens runs on here (``lowbit env``, every benchmark's
    ``meta``): :func:`run`'s paths from :func:`bf16_products` and the token counts where each starts."""
    lib = lib or library()
    if lib is None:
        return "no native kernel (no C compiler built it)"
    span = bf16_products(nibbles, lib)
    parts = [f"{'AMX-BF16 tiles' if amx_bf16(lib) else 'AVX512_BF16 dot products'} from {span[0]} tokens"] if span else []
    matmul_from = span[1] if span else BF16_MIN_TOKENS[nibbles]  # as run() decides
    if matmul_from != NO_END and bf16_matmul_native():
        parts.append(f"torch's bf16 matmul on the unpacked weight from {matmul_from} tokens")
    return ", ".join(parts) or "the exact int16 tiles at every size"


def dpbf16(lib: ctypes.CDLL | None = None) -> bool:
    """Whether this build runs bfloat16 calls of :data:`DPBF16_TOKENS` tokens with AVX512_BF16 dot
    products (``csrc/a16_dpbf16.h``), where there are no AMX-BF16 tiles: the same bfloat16 weight
    values as the tiles, float32 sums, kept in L2 per work item instead of unpacked into memory."""
    lib = lib or library()
    return lib is not None and bool(lib.a16_gemm_dpbf16()) and not amx_bf16(lib)


@dataclass
class A16Panels(CachedPointers):
    panels: torch.Tensor  # uint8 row panels (i8_gemm.panel_codes)
    scale: torch.Tensor  # float32 [out_pad / 16, n_groups, 16]
    zero: torch.Tensor  # int32 [out_pad / 16, n_groups, 16]
    nibbles: bool
    group: int
    n_in: int
    k_pad: int
    out: int
    bias: torch.Tensor | None
    method: str = "gemm"

    def __post_init__(self) -> None:
        # the weight half of a16_gemm_linear's arguments, built once: a decode step calls every layer
        # (rebuilt by copies and unpickling)
        require_cpu("a16 gemm kernel", self.panels, self.scale, self.zero)
        self.args = (self.panels.data_ptr(), int(self.nibbles), self.scale.data_ptr(), self.zero.data_ptr(),
                     i8_gemm.PANEL * self.scale.shape[0], self.k_pad, self.group, self.scale.shape[1], self.n_in)


def _require() -> None:
    if not available():
        raise KernelError("a16 gemm: no C compiler could build its kernel (csrc/a16_gemm.c)")


def prepare_w4(p: LinearParams) -> A16Panels:
    """W4A16 (symmetric or with zero points), the 4-bit GEMV's groups (:func:`.w4_gemv.check_group`)."""
    _require()
    p.check()
    if p.kind != "w4a16" or p.n_outliers:
        raise KernelError(f"a16 gemm: w4a16 without outlier channels, got {p.kind} with {p.n_outliers}")
    out, n = p.codes.shape
    g = w4_gemv.check_group(n, p.group)
    kp, out_pad = -(-n // w4_gemv.CHUNK) * w4_gemv.CHUNK, -(-out // i8_gemm.PANEL) * i8_gemm.PANEL
    if p.zero is None:
        u, zero = p.codes.to(torch.int16) + 8, torch.full(p.scale.shape, 8, dtype=torch.int32)
    else:
        u, zero = p.codes.to(torch.int16), p.zero.to(torch.int32)
    u = F.pad(u, (0, kp - n, 0, out_pad - out))
    return A16Panels(i8_gemm.panel_codes(u, 4), i8_gemm.panel_rows(p.scale.float(), out_pad),
                     i8_gemm.panel_rows(zero, out_pad), True, g if g != n else kp, n, kp, out, p.bias)


def prepare_w8(codes: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None) -> A16Panels:
    """W8A16: INT8 codes ``[out, in]`` and per-row scales ``[out]``; blocks of :data:`W8_BLOCK`."""
    _require()
    if codes.dtype != torch.int8:
        raise KernelError(f"a16 gemm: w8a16 needs int8 codes, got {codes.dtype}")
    out, n = codes.shape
    if scale.numel() != out or (bias is not None and tuple(bias.shape) != (out,)):
        raise ValueError(f"a16 gemm: w8a16 needs one scale (and bias) per row ({out}), got {tuple(scale.shape)}"
                         f"{'' if bias is None else f' / {tuple(bias.shape)}'}")
    kp, out_pad = -(-n // 32) * 32, -(-out // i8_gemm.PANEL) * i8_gemm.PANEL
    ng = -(-kp // W8_BLOCK)
    u = F.pad(codes.to(torch.int16) + 128, (0, kp - n, 0, out_pad - out))
    s = scale.float().reshape(out, 1).expand(out, ng)
    return A16Panels(i8_gemm.panel_codes(u, 8), i8_gemm.panel_rows(s, out_pad),
                     i8_gemm.panel_rows(torch.full((out, ng), 128, dtype=torch.int32), out_pad), False, W8_BLOCK, n,
                     kp, out, bias)


# oneDNN's ISA caps (ONEDNN_MAX_CPU_ISA) under which its matmuls may use bfloat16 dot products
_ONEDNN_BF16_CAPS = ("ALL", "DEFAULT", "AVX512_CORE_BF16", "AVX512_CORE_FP16", "AVX512_CORE_AMX",
                     "AVX512_CORE_AMX_FP16", "AVX10_1_512", "AVX10_1_512_AMX", "AVX10_1_512_AMX_FP16",
                     "AVX10_2_512", "AVX10_2_512_AMX_2")


@functools.lru_cache(maxsize=None)
def bf16_matmul_native() -> bool:
    """Whether torch's bfloat16 matmul multiplies in hardware here (AMX-BF16 or AVX512_BF16, and
    oneDNN allowed to use them), so that it outruns the integer tiles on many tokens. Capping oneDNN
    below them (``ONEDNN_MAX_CPU_ISA=AVX2``, as when an AVX2-only CPU is imitated) leaves torch's
    bfloat16 emulated, 7-9x slower than the tiles at 512 tokens, so the tiles run."""
    f = cpu_info()["features"]
    if not (f.get("amx_bf16") or f.get("avx512_bf16")):
        return False
    return onednn_cap() in _ONEDNN_BF16_CAPS and _torch_onednn_bf16()


def _torch_onednn_bf16() -> bool:
    """torch's own answer (read once per process, with oneDNN's cap as it was then)."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a torch built without oneDNN
        return False


def dequantize_bf16(w: A16Panels, lib: ctypes.CDLL | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """The weight ``[out, in]`` as bfloat16: ``((u - z) * s).to(bfloat16)`` per value, in C; into
    ``out`` (contiguous bfloat16 of that shape) when given."""
    lib = _built(lib)
    require_state(w, A16Panels, "dequantize_bf16")
    shape = (w.out, w.n_in)
    if out is None:
        out = torch.empty(shape, dtype=torch.bfloat16)
    elif out.shape != shape or out.dtype != torch.bfloat16 or not out.is_contiguous():
        raise ValueError(f"dequantize_bf16: out must be contiguous bfloat16 {shape}, "
                         f"got {out.dtype} {tuple(out.shape)}")
    require_cpu("dequantize_bf16", out)
    lib.a16_gemm_dequant(*w.args, w.out, out.data_ptr(), torch.get_num_threads())
    return out


_scratch = threading.local()


def _weight_scratch(shape: tuple[int, int]) -> torch.Tensor:
    """This thread's bfloat16 buffer for a dequantized weight of ``shape``: one storage, grown to the
    largest weight seen and reused by every layer. A fresh one per call costs more than the unpacking:
    a weight of 32 MB and up comes from the kernel as new pages (glibc's mmap threshold), and touching
    them took 7-8 ms of the 10 a 4096² W4A16 call at 512 tokens spent unpacking (AMX Xeon, 2 threads;
    2.5 ms into a reused buffer)."""
    n = shape[0] * shape[1]
    buf = getattr(_scratch, "buf", None)
    if buf is None or buf.numel() < n:
        buf = _scratch.buf = torch.empty(n, dtype=torch.bfloat16)
    return buf[:n].view(shape)


def _bf16_products(x: torch.Tensor, w: A16Panels, lib: ctypes.CDLL, dot: bool = False) -> torch.Tensor:
    """bfloat16 ``x [..., in]`` → bfloat16 ``[..., out]`` (plus bias) on bfloat16 products in C: the
    AMX-BF16 tiles, or the AVX512_BF16 dot products (``dot``: those whatever the tiles, for tests)."""
    a16_linear.check_input(x, w.n_in, "a16 gemm kernel")
    x = x.contiguous()
    y = torch.empty(*x.shape[:-1], w.args[4], dtype=torch.bfloat16)
    fn = lib.a16_gemm_dpbf16_linear if dot else lib.a16_gemm_bf16_linear
    rc = fn(*w.args, x.data_ptr(), 1, x.numel() // w.n_in, y.data_ptr(), 1, torch.get_num_threads())
    if rc < 0:
        raise MemoryError("a16 gemm kernel: out of memory for its bfloat16 weight")
    if rc:
        raise KernelError("a16 gemm kernel: the bfloat16 products it reported could not run")
    y = y[..., :w.out] if w.args[4] != w.out else y
    return y + w.bias.to(y.dtype) if w.bias is not None else y


def run(x: torch.Tensor, w: A16Panels, lib: ctypes.CDLL | None = None) -> torch.Tensor:
    """``x [..., in]`` (float32 or bfloat16; others are converted to float32) → ``[..., out]`` of
    x's dtype (plus bias). Exact int16 arithmetic (the GEMVs' bits), except many-token bfloat16
    calls, which multiply the bfloat16 weight (:func:`dequantize_bf16`'s values) as bfloat16 models
    do: in C on AMX-BF16 tiles for :data:`AMX_BF16_TOKENS` or with AVX512_BF16 dot products from
    :data:`DPBF16_TOKENS` (:func:`bf16_products`), else with torch's bfloat16 matmul from
    :data:`BF16_MIN_TOKENS` (or the tiles' upper end) on CPUs with bfloat16 matmuls. Per value the
    weight's rounding to bfloat16 (2^-9 relative) instead of the activations' int16 one, float32
    sums: within 2^-8·Σ|x·w| + 2^-126·Σ|w| (subnormal inputs read as zero) + the output's rounding
    (tested)."""
    lib = _built(lib)
    require_state(w, A16Panels, "a16 gemm kernel")
    bf16 = isinstance(x, torch.Tensor) and x.dtype == torch.bfloat16
    # asked only for calls that could take them (below neither they nor the matmul run): a decode
    # step's calls make no extra crossing into C
    few = min(AMX_BF16_TOKENS[w.nibbles][0], DPBF16_TOKENS[w.nibbles]) * w.n_in
    span = bf16_products(w.nibbles, lib) if bf16 and x.numel() >= few else None
    if span and span[0] * w.n_in <= x.numel() < span[1] * w.n_in:
        return _bf16_products(x, w, lib)
    if bf16 and x.numel() >= (span[1] if span else BF16_MIN_TOKENS[w.nibbles]) * w.n_in and bf16_matmul_native():
        a16_linear.check_input(x, w.n_in, "a16 gemm kernel")  # below the threshold `call` checks
        # the weight goes into this thread's scratch, which the matmul reads and nothing keeps
        y = F.linear(x, dequantize_bf16(w, lib, _weight_scratch((w.out, w.n_in))))
        return y + w.bias.to(y.dtype) if w.bias is not None else y
    return a16_linear.call(lib.a16_gemm_linear, w.args, w.n_in, w.args[4], w.out, w.bias, x, "a16 gemm kernel")
