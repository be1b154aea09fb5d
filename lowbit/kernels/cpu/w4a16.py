"""W4A16 on CPU, three methods:

- ``gemm`` (default where the group is a multiple of 64 and its build has AVX2 or wider): lowbit's
  batched kernel (:mod:`.a16_gemm`), the ``native`` kernel's int16 arithmetic and bits over tiles
  of several tokens x 32 rows; faster than ``native`` at every batch measured (4096², AVX-512
  VNNI, loaded: 1.4x at batch 1, 2.1-3.1x from 8 on), and with weights read from memory at 1-16
  tokens on Zen 4 and its AVX2 build (1.04-2.36x; 0.95x at one token of 576x1536 on AVX-512).
- ``native`` (the default instead on portable builds): lowbit's AVX2 GEMV kernel with int16
  activations (:mod:`.w4_gemv`), 1.2-1.8x faster than ``int4pack`` on 4096² here.
- ``int4pack``: torch's packed-int4 matmul (``_weight_int4pack_mm_for_cpu``), described below.

Layout ``int4pack`` wants (checked on torch 2.13): weight codes as int32 ``[out, K]`` in 0..15, packed by
``_convert_weight_to_int4pack_for_cpu(codes, innerKTiles=2)``; one ``[K/group, out, 2]``
scale-and-zero tensor with ``value = (code - 8) * scale + zero``; group 32/64/128/256; ``K`` a
multiple of the group, ``out`` of 16. A ragged last group is padded with code 8 (value 0) and zero inputs.
Activations run in bfloat16 (float32 is ~7x slower on AVX2), so the result carries bf16
rounding of the input and output (tested bound: 2^-7 of Σ|x||w|).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from lowbit.kernels.cpu import a16_gemm, w4_gemv
from lowbit.kernels.cpu.method_choice import has_aten_op, pick_method
from lowbit.kernels.cpu.native_args import require_state
from lowbit.kernels.linear_params import KernelError, LinearParams

GROUPS = (32, 64, 128, 256)
METHODS = ("native", "gemm", "int4pack")


@dataclass
class W4A16Prepared:
    packed: torch.Tensor
    scale_zero: torch.Tensor
    group: int
    n_in: int
    k_pad: int
    out: int
    bias: torch.Tensor | None
    dtype: torch.dtype = torch.bfloat16
    method: str = "int4pack"


def available() -> bool:
    return has_aten_op("_weight_int4pack_mm_for_cpu") or w4_gemv.available()


def default_method(p: LinearParams) -> str:
    if not w4_gemv.usable(p):
        return "int4pack"
    return "gemm" if a16_gemm.simd() else "native"


def prepare(p: LinearParams, method: str | None = None):
    """The layout of ``method`` (None: :func:`default_method`)."""
    p.check()
    method = pick_method(method or default_method(p), METHODS, "w4a16")
    if method == "gemm":
        return a16_gemm.prepare_w4(p)
    if method == "native":
        return w4_gemv.prepare(p)
    if not has_aten_op("_weight_int4pack_mm_for_cpu"):
        raise KernelError("this torch build has no _weight_int4pack_mm_for_cpu")
    return _prepare_int4pack(p)


def _prepare_int4pack(p: LinearParams, dtype: torch.dtype = torch.bfloat16) -> W4A16Prepared:
    if p.kind != "w4a16":
        raise KernelError(f"cpu w4a16 kernel got kind {p.kind}")
    if p.n_outliers:
        raise KernelError("cpu w4a16 kernel has no outlier channels")
    g = p.group or p.n_normal
    if g not in GROUPS:
        raise KernelError(f"cpu int4 matmul needs group size in {GROUPS}, got {g}")
    out, n = p.codes.shape
    k_pad = -(-n // g) * g
    if p.zero is None:
        codes = p.codes.to(torch.int32) + 8
        zero = torch.zeros_like(p.scale)
    else:  # (c - z) * s = (c - 8) * s + (8 - z) * s
        codes = p.codes.to(torch.int32)
        zero = (8 - p.zero.float()) * p.scale
    out_pad = -(-out // 16) * 16  # the packing wants out % 16 == 0: extra rows are zeros, sliced off
    codes = F.pad(codes, (0, k_pad - n), value=8)
    codes = F.pad(codes, (0, 0, 0, out_pad - out), value=8)
    scale, zero = F.pad(p.scale, (0, 0, 0, out_pad - out)), F.pad(zero, (0, 0, 0, out_pad - out))
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.contiguous(), 2)
    sz = torch.stack([scale, zero], dim=-1).transpose(0, 1).contiguous().to(dtype)
    return W4A16Prepared(packed, sz, g, n, k_pad, out, p.bias, dtype)


def run(x: torch.Tensor, w) -> torch.Tensor:
    if isinstance(w, a16_gemm.A16Panels):
        return a16_gemm.run(x, w)
    if isinstance(w, w4_gemv.W4GemvPrepared):
        return w4_gemv.run(x, w)
    require_state(w, W4A16Prepared, "cpu w4a16 kernel")
    xb = x.to(w.dtype)
    if w.k_pad != w.n_in:
        xb = F.pad(xb, (0, w.k_pad - w.n_in))
    y = torch.ops.aten._weight_int4pack_mm_for_cpu(xb.contiguous(), w.packed, w.group, w.scale_zero).float()
    if y.shape[1] != w.out:
        y = y[:, :w.out]
    return y + w.bias if w.bias is not None else y
