"""W8A8 on CPU: dynamic per-token INT8 activations, an exact integer product with the INT8
weight, then one float32 rescale by activation scale x weight scale.

Four ways to the exact int32 product (bit-identical results, tested):

- ``gemm`` (the default where :func:`gemm_is_default` says so): lowbit's batched
  int8 kernel (:mod:`.i8_gemm`, ``vpdpbusd`` over tiles of 6 tokens x 32 rows; AMX-INT8 tiles from
  8 tokens where the build has them), faster than the
  GEMV below from batch 1 on (4096², AVX-512 VNNI, loaded: 0.61 against 1.57 ms at batch 1, 11.5
  against 43 ms at 64). Without VNNI it multiplies int16 pairs (``vpmaddwd``): ahead of the GEMV
  at every batch on AVX-512 builds, and on AVX2 builds for layers of 4096 inputs or more.
- ``native`` (the default elsewhere, where it builds): lowbit's C kernel (:mod:`.w8_gemv`), the weight
  kept as 1-byte codes, int32 sums of sign-extended products; faster than ``float`` at every
  batch measured on an AVX2 CPU (3.3x at batch 1, 1.3x at 512 on 4096²). On CPUs with AMX-INT8,
  calls of :data:`INT_MM_MIN_TOKENS` tokens or more run ``torch._int_mm`` on the same bytes
  instead (the weight is stored row-major): measured on 4096², one thread, 2.1 ms against 6.4 at 8
  tokens, 6.7 against 30 at 64. Same bits either way.
- ``int_mm``: ``torch._int_mm`` (int8 x int8 → int32), the weight as the transposed view of a
  row-major ``[out, in]`` tensor (measured ~5x faster than a contiguous ``[in, out]``). On CPUs
  without VNNI/AMX torch runs it as a slow generic loop.
- ``float``: the integer operands as float32 in chunks of 1024 input channels
  (|products| ≤ 2^14, so a chunk's sum stays below 2^24 and float32 SGEMM computes it exactly),
  chunk results added in int32. Stores the weight as float32: exact and fast here, not small.

The only rounding is the float32 rescale: |y - y_exact| ≤ 3·2^-24·|y_exact| (tested against
the float64 integer reference).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lowbit.kernels.cpu.method_choice import int_mm_exact, pick_method
from lowbit.kernels.cpu import i8_gemm, w8_gemv
from lowbit.kernels.cpu.native_args import CachedPointers
from lowbit.kernels.token_codes import quantize_tokens
from lowbit.native.cpu_features import cpu_info
from lowbit.kernels.linear_params import ActSpec, KernelError, LinearParams

METHODS = ("native", "gemm", "float", "int_mm")
EXACT_CHUNK = 1024
INT_MM_MIN_TOKENS = 8


def int_mm_for_batches() -> bool:
    """Whether torch's ``_int_mm`` beats the native GEMV from :data:`INT_MM_MIN_TOKENS` tokens here:
    measured on an AMX-INT8 CPU; without AMX it is not known to (and is a slow loop on AVX2)."""
    return bool(cpu_info()["features"].get("amx_int8", False)) and int_mm_exact() is None


@dataclass
class W8A8Prepared:
    weight: torch.Tensor  # int_mm: int8 [out, in] row-major; float: float32 [in, out]
    scale: torch.Tensor  # float32 [out]
    act: ActSpec
    bias: torch.Tensor | None
    method: str = "float"


GEMM_MIN_IN_AVX2 = 4096


def gemm_is_default(n_in: int = 0) -> bool:
    """Whether the batched kernel wins here at every batch for a layer of ``n_in`` inputs.

    * Its build has VNNI (odd :func:`i8_gemm.simd`), AMX CPUs included (there its AMX tiles take
      calls from 8 tokens). Measured on an AMX Xeon, one thread, quiet, against the GEMV with
      ``_int_mm`` from 8 tokens: 576x960 0.135 vs 0.220 ms at 1 token, 0.259 vs 0.453 at 64;
      576x3072 0.249 vs 0.386, 0.670 vs 1.243; 4096² 1.88 vs 2.17, 6.80 vs 9.10.
    * AVX-512 without VNNI (int16 pairs): 1.15-1.76x the GEMV at 1-512 tokens on 4096², 576x3072
      and 1536x576 (the Zen 4 running that build, stop 54).
    * AVX2, from :data:`GEMM_MIN_IN_AVX2` inputs: 1.00-1.59x at 1-512 tokens on 4096², 4096x11008
      and 11008x4096. On the default model's 576- and 1536-wide layers it leads at 16-64 tokens but
      is level or behind at 512 (0.92-1.02x; the GEMV's 4-token tiles find the small weight in L2)
      and at one token of 576x3072 (0.90x), so those keep the GEMV."""
    level = i8_gemm.simd()
    return level % 2 == 1 or level == 512 or (level == 256 and n_in >= GEMM_MIN_IN_AVX2)


@dataclass
class W8A8NativePrepared(CachedPointers):
    weight: w8_gemv.W8GemvPrepared | i8_gemm.I8Panels  # the GEMV's layout, or the batched kernel's (method gemm)
    act: ActSpec
    bias: torch.Tensor | None
    method: str = "native"
    n_in: int = 0  # gemm: the input width (its panels hold it padded to a multiple of 4)

    def __post_init__(self) -> None:
        # gemm: i8_gemm.linear's weight arguments, built once; they point into weight, so copies and
        # unpickling rebuild them (CachedPointers)
        self.args = None
        if self.method == "gemm":
            self.args = i8_gemm.linear_args(self.weight, None, 0, self.n_in, self.act.bits, self.act.clip,
                                            self.act.half_range)


def available() -> bool:
    return hasattr(torch, "_int_mm")


def prepare(p: LinearParams, method: str | None = None):
    """The layout of ``method`` (None: ``gemm`` where :func:`gemm_is_default`, else ``native`` where
    it builds, else ``float``)."""
    p.check()
    default = "gemm" if gemm_is_default(p.codes.shape[1]) else "native" if w8_gemv.available() else "float"
    method = pick_method(method or default, METHODS, "w8a8")
    if p.kind != "w8a8" or p.act is None or p.act.group != 0:
        raise KernelError("cpu w8a8 kernel needs per-token INT8 activations (group 0)")
    if p.n_outliers or p.zero is not None or p.scale.shape[1] != 1:
        raise KernelError("cpu w8a8 kernel needs symmetric per-channel weights without outliers")
    if method == "gemm":
        if not i8_gemm.available():
            raise KernelError("w8a8 gemm: no C compiler could build its kernel (csrc/i8_gemm.c)")
        kp = -(-p.codes.shape[1] // 4) * 4
        return W8A8NativePrepared(i8_gemm.pack(p.codes, p.scale, 8, kp, kp), p.act, p.bias, "gemm", p.codes.shape[1])
    if method == "native":
        return W8A8NativePrepared(w8_gemv.prepare(p.codes, p.scale[:, 0]), p.act, p.bias)
    if method == "int_mm" and (why := int_mm_exact()):
        raise KernelError(f"w8a8 int_mm: {why}")
    w = p.codes.contiguous() if method == "int_mm" else p.codes.t().float().contiguous()
    return W8A8Prepared(w, p.scale[:, 0].contiguous(), p.act, p.bias, method)


def int_product(codes: torch.Tensor, w: W8A8Prepared) -> torch.Tensor:
    """Exact int32 ``codes [t, in] @ weightᵀ``."""
    if w.method == "int_mm":
        return torch._int_mm(codes, w.weight.t())
    cf = codes.float()
    acc = None
    for k0 in range(0, cf.shape[1], EXACT_CHUNK):
        part = (cf[:, k0:k0 + EXACT_CHUNK] @ w.weight[k0:k0 + EXACT_CHUNK]).to(torch.int32)
        acc = part if acc is None else acc + part
    if acc is None:
        acc = torch.zeros(codes.shape[0], w.scale.shape[0], dtype=torch.int32)
    return acc


def run_gemm(x: torch.Tensor, w: W8A8NativePrepared) -> torch.Tensor:
    """``x [..., in]`` → ``[..., out]`` of x's dtype for float32 and bfloat16 (others: float32) in one
    C call (codes, exact products, float32 rescale, the rounding to bfloat16 as torch's), a bias
    added in float32 before that rounding."""
    return i8_gemm.linear_in_dtype(x, w.args, w.weight.out, w.bias)


def run(x: torch.Tensor, w) -> torch.Tensor:
    if w.method == "gemm":  # codes, the exact products and float32 rescale in one C call
        y = i8_gemm.linear(x, w.args, w.weight.out)
    elif w.method == "native" and x.dim() == 2 and x.shape[0] >= INT_MM_MIN_TOKENS and int_mm_for_batches():
        y = _int_mm_on_native(x, w.weight, w.act)
    elif w.method == "native":  # codes and float(P) * (x_scale * w_scale) in C: the float method's bits
        y = w8_gemv.quantize_and_run(x, w.weight, w.act.bits, w.act.clip, half=w.act.half_range)
    else:
        a = quantize_tokens(x, w.act)
        y = int_product(a.codes, w).float() * (a.scale * w.scale[None, :])
    return y + w.bias if w.bias is not None else y


def _int_mm_on_native(x: torch.Tensor, w: w8_gemv.W8GemvPrepared, act: ActSpec) -> torch.Tensor:
    """The native layout's bytes through ``torch._int_mm``: C activation codes, the exact int32
    product, the same float32 rescale (the native kernel's bits)."""
    c = w8_gemv.act_codes(x, w, act.bits, act.clip, half=act.half_range)
    return w8_gemv.rescale(torch._int_mm(c.xq.to(torch.int8), w.packed.t()), c.scale, w)
