"""W8A16 on CPU, three methods:

- ``gemm`` (default where its build has AVX-512): lowbit's batched kernel (:mod:`.a16_gemm`), the
  ``native`` kernel's int16 arithmetic and bits over tiles of several tokens x 32 rows; faster than
  ``native`` at every batch measured on AVX-512 (4096², loaded: 1.5x at batch 1, 2.2-3.8x from 8
  on). Its AVX2 build lost to ``native`` at batch 1 (0.6x), so ``native`` stays the default there.
- ``native`` (default where it builds): lowbit's INT8-weight kernel with int16 activations
  (:func:`.w8_gemv.run`): at batch 1 it streams the 1-byte weight near memory bandwidth, where
  ``int8pack`` runs no faster than bf16 on the default model's LM head (49152 x 576).
- ``int8pack``: torch's ``_weight_int8pack_mm`` (int8 ``[out, in]`` weight, bf16 activations). Its
  own per-channel scale is given as ones and the float32 scale is applied to its output, so the
  fp16 weight scales are not rounded to bf16. Error: bf16 rounding of input and output (tested
  bound 2^-7 of Σ|x||w|). Its AVX-512 path steps over the input dim 16 values at a time with no
  remainder loop (torch 2.13): other widths read past the rows and return garbage or segfault
  (measured: in=200 crashes, in=24 returns 1e13). So the weight is zero-padded to a multiple of
  :data:`INT8PACK_K` once and the activations per call; the op never sees another width.

Both: symmetric per-channel weights only (group 0), no outliers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from lowbit.kernels.cpu import a16_gemm, w8_gemv
from lowbit.kernels.cpu.method_choice import has_aten_op, pick_method
from lowbit.kernels.cpu.native_args import require_state
from lowbit.kernels.linear_params import KernelError, LinearParams

METHODS = ("native", "gemm", "int8pack")
INT8PACK_K = 16  # the input width _weight_int8pack_mm handles on every x86 path (AVX2: 8, AVX-512: 16)


@dataclass
class W8A16Prepared:
    weight: torch.Tensor  # int8 [out, in]
    ones: torch.Tensor
    scale: torch.Tensor  # float32 [out]
    bias: torch.Tensor | None
    n_in: int = 0  # the true input width (weight columns past it are zero padding)
    dtype: torch.dtype = torch.bfloat16
    method: str = "int8pack"


def available() -> bool:
    return has_aten_op("_weight_int8pack_mm") or w8_gemv.available()


def _check(p: LinearParams) -> None:
    p.check()
    if p.kind != "w8a16":
        raise KernelError(f"cpu w8a16 kernel got kind {p.kind}")
    if p.n_outliers or p.zero is not None or p.scale.shape[1] != 1:
        raise KernelError("cpu w8a16 kernel needs symmetric per-channel weights without outliers")


def default_method() -> str:
    """``gemm`` where its build has AVX-512, else ``native`` where it builds, else ``int8pack``."""
    if a16_gemm.simd() >= 512:
        return "gemm"
    return "native" if w8_gemv.available() else "int8pack"


def prepare(p: LinearParams, method: str | None = None):
    """The layout of ``method`` (None: :func:`default_method`)."""
    method = pick_method(method or default_method(), METHODS, "w8a16")
    _check(p)
    if method == "gemm":
        return a16_gemm.prepare_w8(p.codes, p.scale[:, 0], p.bias)
    if method == "native":
        st = w8_gemv.prepare(p.codes, p.scale[:, 0])
        st.bias = p.bias
        return st
    if not has_aten_op("_weight_int8pack_mm"):
        raise KernelError("this torch build has no _weight_int8pack_mm")
    n = p.codes.shape[1]
    codes = F.pad(p.codes, (0, -n % INT8PACK_K)).contiguous()
    return W8A16Prepared(codes, torch.ones(p.out_features, dtype=torch.bfloat16), p.scale[:, 0].contiguous(), p.bias, n)


def run(x: torch.Tensor, w) -> torch.Tensor:
    if isinstance(w, a16_gemm.A16Panels):
        return a16_gemm.run(x, w)
    if isinstance(w, w8_gemv.W8GemvPrepared):
        return w8_gemv.run(x, w)
    require_state(w, W8A16Prepared, "cpu w8a16 kernel")
    xb = x.to(w.dtype)
    k = w.weight.shape[1]
    if k % INT8PACK_K or x.shape[-1] != w.n_in:  # never reached through prepare: the op must not see it
        raise KernelError(f"int8pack: input width {x.shape[-1]} / padded {k} (needs {w.n_in} / a multiple of {INT8PACK_K})")
    if k != w.n_in:
        xb = F.pad(xb, (0, k - w.n_in))
    y = torch.ops.aten._weight_int8pack_mm(xb.contiguous(), w.weight, w.ones).float() * w.scale
    return y + w.bias if w.bias is not None else y
