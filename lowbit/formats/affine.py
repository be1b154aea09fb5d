"""The affine quantization map: x ≈ scale · (q − zero_point).

Three primitives, as in torchao: :func:`choose_qparams`, :func:`quantize`,
:func:`dequantize`. All math runs in float32 on a block view (see ``granularity``);
rounding is half-to-even (``torch.round``).

Symmetric quantization comes in two ranges:

* full range ``[-2^(b-1), 2^(b-1)-1]``: the scale is the *signed* absmax divided by
  ``-2^(b-1)``, so the largest-magnitude value lands exactly on the extra negative code
  (the scale is negative when that value is positive). This is QuickReduce's choice.
* narrow range ``[-(2^(b-1)-1), 2^(b-1)-1]``: positive scale ``absmax / (2^(b-1)-1)``.

Asymmetric quantization uses unsigned codes ``[0, 2^b-1]`` over ``[min(x,0), max(x,0)]``
with an integer zero point, so 0 is always represented exactly.

Inside the range every value satisfies ``|x − x̂| ≤ |scale|/2`` (up to float rounding).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .absmax import nonzero_scale, store_scale, symmetric_scale
from .checks import check_bits, check_float_input
from .granularity import Granularity, PerTensor, from_blocks, to_blocks


def qrange(bits: int, symmetric: bool, full_range: bool = True) -> tuple[int, int]:
    """The integer code range of a format."""
    check_bits(bits)
    if not symmetric:
        return 0, 2**bits - 1
    hi = 2 ** (bits - 1) - 1
    return (-hi - 1 if full_range else -hi), hi


@dataclass(frozen=True)
class QParams:
    """Scales (and zero points) of one quantized tensor, one entry per block."""

    scale: torch.Tensor  # [n_blocks], float; negative allowed for full-range symmetric
    zero_point: torch.Tensor | None  # [n_blocks] int32, asymmetric only
    bits: int
    symmetric: bool
    full_range: bool
    granularity: Granularity

    @property
    def qmin(self) -> int:
        return qrange(self.bits, self.symmetric, self.full_range)[0]

    @property
    def qmax(self) -> int:
        return qrange(self.bits, self.symmetric, self.full_range)[1]


def _safe_scale(scale: torch.Tensor, scale_dtype: torch.dtype) -> torch.Tensor:
    """Cast to the storage dtype, never shrinking the magnitude (so the grid still covers the
    block's range); an all-zero block gets scale 1 so it decodes to exact zeros."""
    scale = store_scale(scale, scale_dtype)
    if not bool(torch.isfinite(scale).all()):
        raise ValueError(f"a scale overflows {scale_dtype}; the input is too large for this scale dtype")
    return nonzero_scale(scale)


def choose_qparams(
    x: torch.Tensor,
    bits: int,
    *,
    symmetric: bool = True,
    granularity: Granularity = PerTensor(),
    full_range: bool = True,
    clip_ratio: float = 1.0,
    scale_dtype: torch.dtype = torch.float32,
    ties: str = "positive",
) -> QParams:
    """Pick the scale (and zero point) of every block from the data. ``ties``: which of two
    values of equal largest magnitude sets a full-range scale (see :mod:`lowbit.formats.absmax`)."""
    check_bits(bits)
    check_float_input(x)
    if not 0.0 < clip_ratio <= 1.0:
        raise ValueError(f"clip_ratio must be in (0, 1], got {clip_ratio}")
    blocks, _ = to_blocks(x.float(), granularity)
    qmin, qmax = qrange(bits, symmetric, full_range)
    if blocks.numel() == 0:
        empty = torch.empty(blocks.shape[0], dtype=scale_dtype, device=x.device)
        zp = None if symmetric else torch.empty(blocks.shape[0], dtype=torch.int32, device=x.device)
        return QParams(empty, zp, bits, symmetric, full_range, granularity)
    if symmetric:
        if full_range:
            scale = symmetric_scale(blocks, bits, clip_ratio, ties)
        else:
            scale = blocks.abs().amax(dim=1) * clip_ratio / qmax
        return QParams(_safe_scale(scale, scale_dtype), None, bits, True, full_range, granularity)
    lo = blocks.amin(dim=1).clamp(max=0) * clip_ratio
    hi = blocks.amax(dim=1).clamp(min=0) * clip_ratio
    scale = _safe_scale((hi - lo) / (qmax - qmin), scale_dtype)
    zero_point = torch.round(-lo / scale.float()).clamp(qmin, qmax).to(torch.int32)
    return QParams(scale, zero_point, bits, False, full_range, granularity)


def code_dtype(qp: QParams) -> torch.dtype:
    return torch.int8 if qp.symmetric else torch.uint8


def quantize(x: torch.Tensor, qp: QParams) -> torch.Tensor:
    """Codes of ``x`` under ``qp``, in x's shape (int8 symmetric, uint8 asymmetric)."""
    check_float_input(x)
    blocks, view = to_blocks(x.float(), qp.granularity)
    if blocks.shape[0] != qp.scale.shape[0]:
        raise ValueError(f"qparams have {qp.scale.shape[0]} blocks, the input has {blocks.shape[0]}")
    q = torch.round(blocks / qp.scale.float()[:, None])
    if qp.zero_point is not None:
        q = q + qp.zero_point[:, None].float()
    q = q.clamp(qp.qmin, qp.qmax).to(code_dtype(qp))
    return from_blocks(q, view)


def dequantize(codes: torch.Tensor, qp: QParams, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Values ``scale · (q − zero_point)`` in ``dtype``."""
    blocks, view = to_blocks(codes, qp.granularity)
    q = blocks.float()
    if qp.zero_point is not None:
        q = q - qp.zero_point[:, None].float()
    out = q * qp.scale.float()[:, None]
    return from_blocks(out, view).to(dtype)


def fake_quantize(x: torch.Tensor, bits: int, **kwargs) -> tuple[torch.Tensor, QParams]:
    """Quantize then dequantize, in x's dtype; returns the values and their qparams."""
    qp = choose_qparams(x, bits, **kwargs)
    return dequantize(quantize(x, qp), qp, x.dtype), qp


def block_scale_per_element(qp: QParams, shape: tuple[int, ...]) -> torch.Tensor:
    """|scale| broadcast back to every element of a tensor of ``shape``."""
    from .granularity import n_blocks

    nb = n_blocks(shape, qp.granularity)
    probe = torch.zeros(shape, dtype=torch.float32, device=qp.scale.device)
    blocks, view = to_blocks(probe, qp.granularity)
    assert blocks.shape[0] == nb
    return from_blocks(blocks + qp.scale.float().abs()[:, None], view)


def in_range(x: torch.Tensor, qp: QParams) -> torch.Tensor:
    """Mask of values that the grid covers (within half a step of its ends): where the bound holds.

    Full-range symmetric grids are lopsided: values of the sign opposite to the absmax beyond
    ``(2^(b-1) - 1/2) · |scale|`` fall outside and are clamped. So do values a clip ratio cuts.
    """
    blocks, view = to_blocks(x.float(), qp.granularity)
    v = blocks / qp.scale.float()[:, None]
    if qp.zero_point is not None:
        v = v + qp.zero_point[:, None].float()
    return from_blocks((v >= qp.qmin - 0.5) & (v <= qp.qmax + 0.5), view)


def requantize_values(x: torch.Tensor, qp: QParams) -> torch.Tensor:
    """``dequantize(quantize(x, qp), qp, x.dtype)`` in one pass over float blocks, without codes.

    Bit-identical to the two-step path (every intermediate is a small integer, exact in float32),
    for measuring many formats quickly. ``x`` must already be validated (as by choose_qparams).
    """
    blocks, view = to_blocks(x.float(), qp.granularity)
    s = qp.scale.float()[:, None]
    q = torch.round(blocks / s)
    if qp.zero_point is not None:
        zp = qp.zero_point.float()[:, None]
        q.add_(zp).clamp_(qp.qmin, qp.qmax).sub_(zp)
    else:
        q.clamp_(qp.qmin, qp.qmax)
    return from_blocks(q.mul_(s), view).to(x.dtype)
