"""Exact error accounting of the two-shot all-reduce, in one process.

``simulate`` replays both phases without communication (rows are independent, so this equals the
distributed result bit for bit); ``error_bound`` gives, per element, the two-stage bound:
the quantization error of every rank's input plus that of the re-quantized sum, plus the fp32
accumulation and final-cast rounding.
"""

from __future__ import annotations

import math

import torch

from .twoshot import FP16_OVERFLOW_CLAMP
from .codecs import BLOCK, Codec, decode, encode, fp_wire_dtype, get_codec
from .codecs import extscale
from .codecs.fast import as_rows, fp16_sums, saturate_f16

_UNIT_ROUNDOFF = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8, torch.float32: 2.0**-24}
_MIN_SUBNORMAL_HALF = {torch.float16: 2.0**-25, torch.bfloat16: 2.0**-134, torch.float32: 2.0**-150}


def simulate(inputs: list[torch.Tensor], codec: str | Codec) -> torch.Tensor:
    """What every rank holds after QuickAllReduce's quantized path, given each rank's input."""
    c = get_codec(codec)
    dtype = inputs[0].dtype
    fpw = fp_wire_dtype(dtype)
    n = inputs[0].numel()
    f16 = dtype == torch.float16 and c.kind != "fp"

    def part(x: torch.Tensor) -> torch.Tensor:
        v = decode(encode(x.reshape(-1), c), c, n, torch.float32, fp_wire=fpw)
        return saturate_f16(v) if f16 else v

    acc = part(inputs[0])
    for x in inputs[1:]:  # rank order, as every rank accumulates
        acc += part(x)
    if f16:
        acc = fp16_sums(acc, FP16_OVERFLOW_CLAMP)
    return decode(encode(acc, c, fp_wire=fpw), c, n, dtype, fp_wire=fpw)


def quantization_bound(x: torch.Tensor, codec: str | Codec, fp_wire: torch.dtype | None = None) -> torch.Tensor:
    """Per-element bound on |decode(encode(x)) - x| (float64, x's flat length)."""
    c = get_codec(codec)
    n = x.numel()
    xf = x.reshape(-1).double()
    if c.kind == "fp":
        wd = fp_wire or fp_wire_dtype(x.dtype)
        return xf.abs() * _UNIT_ROUNDOFF[wd] + _MIN_SUBNORMAL_HALF[wd]
    wire = encode(x.reshape(-1), c, fp_wire=fp_wire)
    s32, ext = extscale.scale_values(wire[:, c.code_bytes :].contiguous().view(torch.float16).reshape(-1, 1))
    s = s32.double()
    blocks = as_rows(xf).reshape(-1, BLOCK)
    if c.kind == "int":
        t = blocks / s
        inside = (t >= c.qmin - 0.5) & (t <= c.qmax + 0.5)
        bound = torch.where(inside, s.abs() / 2, s.abs())
    else:
        a = (blocks / s).abs()
        half_gap = torch.where(a <= 2, 0.25, torch.where(a <= 4, 0.5, 1.0))
        bound = s.abs() * half_gap
    bound = torch.where(ext, 2 * s.abs(), bound)  # extended scale: a code may step toward zero
    return bound.reshape(-1)[:n] * (1 + 1e-6)


def error_bound(inputs: list[torch.Tensor], codec: str | Codec) -> torch.Tensor:
    """Per-element bound on |QuickAllReduce result - exact float64 sum| (finite inputs)."""
    c = get_codec(codec)
    dtype = inputs[0].dtype
    fpw = fp_wire_dtype(dtype)
    n = inputs[0].numel()
    stage1 = sum(quantization_bound(x, c) for x in inputs)
    acc = torch.zeros(n, dtype=torch.float32)
    for x in inputs:
        acc += decode(encode(x.reshape(-1), c), c, n, torch.float32, fp_wire=fpw)
    stage2 = quantization_bound(acc, c, fp_wire=fpw)
    mag = acc.double().abs() + stage2
    accumulate = len(inputs) * _UNIT_ROUNDOFF[torch.float32] * sum(
        decode(encode(x.reshape(-1), c), c, n, torch.float32, fp_wire=fpw).double().abs() for x in inputs
    )
    final_cast = mag * _UNIT_ROUNDOFF[dtype] + _MIN_SUBNORMAL_HALF[dtype]
    return stage1 + stage2 + accumulate + final_cast


def exact_sum(inputs: list[torch.Tensor]) -> torch.Tensor:
    return sum(x.reshape(-1).double() for x in inputs)


def accuracy_report(codecs: list[str], world_size: int, n: int, dtype: torch.dtype, seed: int = 0) -> list[dict]:
    """Per codec: SQNR against the exact float64 sum and the largest error as a fraction of the
    per-element two-stage bound (<= 1 always; tested), on activation-like data of every rank."""
    g = torch.Generator().manual_seed(seed)
    inputs = []
    for _ in range(world_size):
        x = torch.randn(n, generator=g)
        idx = torch.randint(0, n, (max(1, n // 1000),), generator=g)
        x[idx] *= 20  # a few outliers, as in LLM activations
        inputs.append(x.to(dtype))
    exact = exact_sum(inputs)
    rows = []
    for c in codecs:
        got = simulate(inputs, c).double()
        err = (got - exact).abs()
        bound = error_bound(inputs, c)
        noise = float((err * err).sum())
        sqnr = float("inf") if noise == 0 else 10 * math.log10(float((exact * exact).sum()) / noise)
        rows.append({"codec": c, "world_size": world_size, "sqnr_db": sqnr, "max_err_over_bound": float((err / bound).max()),
                     "max_abs_err": float(err.max())})
    return rows
