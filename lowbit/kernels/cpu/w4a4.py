"""W4A4 on CPU (Atom's arithmetic): INT4-valued activations and weights in groups of ``g``
input channels, an exact integer product per group, each group's product rescaled by
act_scale[token, group] x w_scale[out, group] and accumulated in float32; the INT8 outlier
channels are one more exact integer product with their own per-token / per-channel scales.

Scales do not factor across groups (per-token times per-output scales, both changing per
group), so groups cannot share one integer accumulator. Three ways to get the exact products:

- ``native`` (default where it builds and the group is a multiple of 64): lowbit's 4-bit C
  kernel (:mod:`.w4_gemv`) reads the packed half-byte weights and sums each group's integer
  products exactly in int32 (``vpmaddwd``), then rescales in float32; about 4x faster than
  ``float`` at batch 1, and the weights stay 4-bit in memory.
- ``gemm`` (the default instead where its build has AVX2 or wider): lowbit's batched int8 kernel
  (:mod:`.i8_gemm`): the INT4 codes as bytes in ``vpdpbusd`` (VNNI) or ``vpmaddubsw`` (exact for
  4-bit values) over tiles of 6 tokens x 32 rows, the INT8 outlier part in the same call; the same
  bits as ``native`` (tested), faster at every batch measured (4096², AVX-512 VNNI, loaded: 0.24
  against 0.64 ms at batch 1, 13.6 against 84 ms at 64; on this CPU's AVX2 build 1.5-2.7x).
- ``int_mm``: one int8 x int8 → int32 ``torch._int_mm`` per group. True integer arithmetic,
  but on CPUs without VNNI/AMX torch runs it as a slow generic loop (measured ~0.4 GOP/s on
  this AVX2 machine, 20-100x slower than fp32 SGEMM).
- ``float``: the same integer operands held as float32, all groups in one batched
  SGEMM (``bmm`` over ``[groups, tokens, g] x [groups, g, out]``). Every partial sum is an
  integer of magnitude ≤ g·8·8 = 8192 < 2^24, so float32 computes it *exactly*: the group
  products equal ``_int_mm``'s bit for bit (tested), at SGEMM speed. The INT8 outliers
  (|products| ≤ 2^14) are summed exactly in chunks of ≤ 1024 channels, chunks in int32.

Either way the only error is the float32 rescale and accumulation: |y - y_exact| ≤
(n_groups + 3)·2^-24·Σ|terms| (tested against the float64 integer reference). The ``float``
method stores the weight codes as float32 (4 bytes per INT4 weight): it buys arithmetic exactness
and speed at large batches, not bytes. The INT8 outlier product is the same float32-exact one for
``native`` and ``float``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lowbit.formats.grid import to_groups
from lowbit.kernels.cpu import i8_gemm, w4_gemv, w8_gemv
from lowbit.kernels.cpu.method_choice import int_mm_exact, pick_method
from lowbit.kernels.cpu.native_args import CachedPointers
from lowbit.kernels.token_codes import IntActivation, quantize_tokens
from lowbit.kernels.linear_params import ActSpec, KernelError, LinearParams

METHODS = ("native", "gemm", "float", "int_mm")
EXACT_CHUNK = 1024  # int8 x int8 products ≤ 2^14: sums of ≤ 1024 stay below 2^24
_CHUNK_BYTES = 32 << 20  # cap on the [groups, tokens, out] float32 partial products held at once


@dataclass
class W4A4Prepared:
    weight: torch.Tensor  # int_mm: int8 [n_groups, out, g]; float: float32 [n_groups, g, out] (values -8..7)
    scale_t: torch.Tensor  # float32 [n_groups, out]
    outlier: torch.Tensor  # int_mm: int8 [out, k]; float: float32 [k, out]
    outlier_scale: torch.Tensor  # float32 [out]
    act: ActSpec
    n_normal: int
    group: int
    bias: torch.Tensor | None
    method: str = "float"


@dataclass
class W4A4NativePrepared:
    normal: w4_gemv.W4GemvPrepared  # packed INT4 weights of the normal channels
    outlier: torch.Tensor  # float32 [k, out] (INT8 values); [k, 0] when outlier_native holds them
    outlier_scale: torch.Tensor  # float32 [out]
    act: ActSpec
    bias: torch.Tensor | None
    method: str = "native"
    outlier_native: w8_gemv.W8GemvPrepared | None = None  # the INT8 outliers for the 8-bit kernel


@dataclass
class W4A4GemmPrepared(CachedPointers):
    normal: i8_gemm.I8Panels  # INT4 panels of the normal channels
    outlier: i8_gemm.I8Panels | None  # INT8 panels of the outlier channels (None: none)
    n_outliers: int
    act: ActSpec
    bias: torch.Tensor | None
    n_in: int
    method: str = "gemm"

    def __post_init__(self) -> None:
        # i8_gemm.linear's weight arguments, built once: a decode step calls every layer (rebuilt by
        # copies and unpickling)
        self.args = i8_gemm.linear_args(self.normal, self.outlier, self.n_outliers, self.n_in, self.act.bits,
                                        self.act.clip, self.act.half_range)


def available() -> bool:
    return hasattr(torch, "_int_mm")


def default_method(p: LinearParams) -> str:
    if not w4_gemv.usable(p):
        return "float"
    return "gemm" if i8_gemm.simd() else "native"


def prepare(p: LinearParams, method: str | None = None):
    """The layout of ``method`` (None: :func:`default_method`)."""
    p.check()
    method = pick_method(method or default_method(p), METHODS, "w4a4")
    if p.kind != "w4a4" or p.act is None:
        raise KernelError(f"cpu w4a4 kernel got kind {p.kind}")
    if p.zero is not None:
        raise KernelError("cpu w4a4 kernel needs symmetric weights")
    g = p.group or p.n_normal
    if (p.act.group or p.n_normal) != g:
        raise KernelError(f"weight group {g} != activation group {p.act.group}: scales would not align")
    if p.act.bits > 4 or g * 64 >= 2 ** 24:
        raise KernelError(f"exact float32 group products need INT4 activations and g·64 < 2^24, got A{p.act.bits} g{g}")
    if method == "gemm":
        return _prepare_gemm(p, g)
    if method == "native":
        o8 = w8_gemv.prepare(p.outlier, p.outlier_scale) if p.n_outliers and w8_gemv.available() else None
        # the float32 copy only where the 8-bit kernel did not build (else [k, 0]: no bytes, k kept)
        o32 = p.outlier.t().float().contiguous() if o8 is None else torch.empty(p.n_outliers, 0)
        return W4A4NativePrepared(w4_gemv.prepare(p, kinds=("w4a4",)), o32, p.outlier_scale.contiguous(), p.act,
                                  p.bias, outlier_native=o8)
    out, n = p.codes.shape
    ng = p.scale.shape[1]
    w = to_groups(p.codes, g).reshape(out, ng, g)
    if method == "int_mm":
        if why := int_mm_exact():
            raise KernelError(f"w4a4 int_mm: {why}")
        w, o = w.transpose(0, 1).contiguous(), p.outlier.contiguous()
    else:
        w, o = w.permute(1, 2, 0).float().contiguous(), p.outlier.t().float().contiguous()
    return W4A4Prepared(w, p.scale.t().contiguous(), o, p.outlier_scale.contiguous(), p.act, n, g, p.bias, method)


def _prepare_gemm(p: LinearParams, g: int) -> W4A4GemmPrepared:
    if not i8_gemm.available():
        raise KernelError("w4a4 gemm: no C compiler could build its kernel (csrc/i8_gemm.c)")
    n, k = p.n_normal, p.n_outliers
    g = w4_gemv.check_group(n, g)  # the native kernel's groups, so the same activation codes
    kp = -(-n // w4_gemv.CHUNK) * w4_gemv.CHUNK
    normal = i8_gemm.pack(p.codes, p.scale, 4, g if g != n else kp, kp)
    ko = -(-k // 4) * 4
    outlier = i8_gemm.pack(p.outlier, p.outlier_scale[:, None], 8, ko, ko) if k else None
    return W4A4GemmPrepared(normal, outlier, k, p.act, p.bias, p.in_features)


def _group_codes(a: IntActivation, w: W4A4Prepared) -> torch.Tensor:
    """Activation codes as ``[n_groups, tokens, g]`` (ragged tail zero-padded)."""
    t = a.codes.shape[0]
    ng, g = w.scale_t.shape[0], w.group
    return to_groups(a.codes, g).reshape(t, ng, g).transpose(0, 1)


def _outliers_float(a: IntActivation, w) -> torch.Tensor:
    """Exact int32 ``[t, out]`` of the INT8 outlier product via float32 chunks."""
    ao = a.outlier.float()
    acc = None
    for k0 in range(0, ao.shape[1], EXACT_CHUNK):
        part = (ao[:, k0:k0 + EXACT_CHUNK] @ w.outlier[k0:k0 + EXACT_CHUNK]).to(torch.int32)
        acc = part if acc is None else acc + part
    return acc


def matmul_int(a: IntActivation, w: W4A4Prepared) -> torch.Tensor:
    """The integer part, given already-quantized activations."""
    ag = _group_codes(a, w)
    ng, t = ag.shape[0], ag.shape[1]
    out = w.scale_t.shape[1]
    y = torch.zeros(t, out, dtype=torch.float32)
    if w.method == "int_mm":
        ag = ag.contiguous()
        for gi in range(ng):
            prod = torch._int_mm(ag[gi], w.weight[gi].t())
            y.addcmul_(prod.float() * a.scale[:, gi:gi + 1], w.scale_t[gi])
        if w.outlier.shape[1]:
            prod = torch._int_mm(a.outlier, w.outlier.t())
            y.addcmul_(prod.float() * a.outlier_scale[:, None], w.outlier_scale)
    else:
        agf = ag.float()
        step = max(1, _CHUNK_BYTES // max(1, t * out * 4))
        for g0 in range(0, ng, step):
            prod = torch.bmm(agf[g0:g0 + step], w.weight[g0:g0 + step])  # exact integers in float32
            for j in range(prod.shape[0]):
                gi = g0 + j
                y.addcmul_(prod[j] * a.scale[:, gi:gi + 1], w.scale_t[gi])
        if w.outlier.shape[0]:
            y.addcmul_(_outliers_float(a, w).float() * a.outlier_scale[:, None], w.outlier_scale)
    return y + w.bias if w.bias is not None else y


def _run_native(x: torch.Tensor, w: W4A4NativePrepared) -> torch.Tensor:
    """Codes and the normal channels' GEMV in C (the same codes as :func:`quantize_tokens`), then
    the INT8 outliers' exact product in the 8-bit kernel (torch's float32 route where it did not build)."""
    k = w.outlier.shape[0]
    y, c = w4_gemv.quantize_and_run(x, w.normal, k, w.act.bits, w.act.clip, half=w.act.half_range)
    if k and w.outlier_native is not None:  # float(P) * (w_scale * x_scale), exact P, in the 8-bit kernel
        y += w8_gemv.run_int16_codes(c.outlier, c.outlier_scale, w.outlier_native)
    elif k:
        a = IntActivation(c.xq, c.scale, c.outlier, c.outlier_scale)
        y.addcmul_(_outliers_float(a, w).float() * a.outlier_scale[:, None], w.outlier_scale)
    return y + w.bias if w.bias is not None else y


def input_order(perm: torch.Tensor) -> i8_gemm.InputOrder:
    """``perm`` checked and planned once for :func:`run_gemm` (ValueError for an index outside the input)."""
    return i8_gemm.InputOrder(perm)


def run_gemm(x: torch.Tensor, w: W4A4GemmPrepared, perm: torch.Tensor | i8_gemm.InputOrder | None = None) -> torch.Tensor:
    """``x [..., in]`` (read as ``x[..., perm]`` when given) → ``[..., out]`` of x's dtype for
    float32 and bfloat16 (others: float32): codes, both exact products and their rescales in one C
    call (the bits of :func:`i8_gemm.act_codes` then :func:`i8_gemm.run_codes`), a bias added in
    float32 before the rounding to bfloat16."""
    return i8_gemm.linear_in_dtype(x, w.args, w.normal.out, w.bias, perm)


def run(x: torch.Tensor, w) -> torch.Tensor:
    if w.method == "gemm":  # codes, both exact products and their float32 rescales in one C call
        y = i8_gemm.linear(x, w.args, w.normal.out)
        return y + w.bias if w.bias is not None else y
    if w.method == "native":
        return _run_native(x, w)
    k = w.outlier.shape[1] if w.method == "int_mm" else w.outlier.shape[0]
    return matmul_int(quantize_tokens(x, w.act, k), w)
