"""W8A16 on CPU through ``_weight_int8pack_mm`` (int8 ``[out, in]`` weight, bf16 activations).

The kernel's own per-channel scale is given as ones and the float32 scale is applied to its
output, so the fp16 weight scales are not rounded to bf16. Error: bf16 rounding of input and
output (tested bound 2^-7 of Σ|x||w|). Per-channel weights only (group 0), no outliers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .params import KernelError, LinearParams


@dataclass
class W8A16Prepared:
    weight: torch.Tensor  # int8 [out, in]
    ones: torch.Tensor
    scale: torch.Tensor  # float32 [out]
    bias: torch.Tensor | None
    dtype: torch.dtype = torch.bfloat16


def available() -> bool:
    return hasattr(torch.ops.aten, "_weight_int8pack_mm")


def prepare(p: LinearParams, dtype: torch.dtype = torch.bfloat16) -> W8A16Prepared:
    if p.kind != "w8a16":
        raise KernelError(f"cpu w8a16 kernel got kind {p.kind}")
    if p.n_outliers or p.zero is not None or p.scale.shape[1] != 1:
        raise KernelError("cpu w8a16 kernel needs symmetric per-channel weights without outliers")
    return W8A16Prepared(p.codes.contiguous(), torch.ones(p.out_features, dtype=dtype), p.scale[:, 0].contiguous(),
                         p.bias, dtype)


def run(x: torch.Tensor, w: W8A16Prepared) -> torch.Tensor:
    y = torch.ops.aten._weight_int8pack_mm(x.to(w.dtype).contiguous(), w.weight, w.ones).float() * w.scale
    return y + w.bias if w.bias is not None else y
