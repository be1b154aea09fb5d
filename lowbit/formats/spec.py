"""Number formats as small frozen dataclasses with one interface.

Each format knows how to fake-quantize a tensor (quantize, then dequantize, for measuring),
how many bits per value it really costs (codes + scales + zero points), and its worst-case
absolute error for given data.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .affine import choose_qparams, requantize_values
from .fp4 import fp4_dequantize, fp4_quantize
from .fp8 import FP8_DTYPES, fp8_dequantize, fp8_quantize
from .granularity import Granularity, PerChannel, PerGroup, PerTensor, PerToken, n_blocks

_SCALE_DTYPES = {16: torch.float16, 32: torch.float32}


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def effective_bits(bits: float, numel: int, blocks: int, scale_bits: int = 16, zero_bits: int = 0) -> float:
    """Bits per value, counting codes, one scale per block and (asymmetric) one zero point per block."""
    if numel == 0:
        return float(bits)
    return (numel * bits + blocks * (scale_bits + zero_bits)) / numel


@dataclass(frozen=True)
class IntFormat:
    """Integer affine format: ``bits``, symmetry, granularity, clip ratio and scale storage."""

    bits: int
    symmetric: bool = True
    granularity: Granularity = field(default_factory=lambda: PerChannel(0))
    full_range: bool = True
    clip_ratio: float = 1.0
    scale_bits: int = 16
    zero_bits: int = 16  # asymmetric zero point stored like the scale (4.25 bits for INT4 g128)

    @property
    def name(self) -> str:
        sym = "sym" if self.symmetric else "asym"
        return f"INT{self.bits} {sym} {self.granularity.name()}"

    def qparams(self, x: torch.Tensor):
        return choose_qparams(
            x,
            self.bits,
            symmetric=self.symmetric,
            granularity=self.granularity,
            full_range=self.full_range,
            clip_ratio=self.clip_ratio,
            scale_dtype=_SCALE_DTYPES[self.scale_bits],
        )

    def fake_quantize(self, x: torch.Tensor) -> torch.Tensor:
        return requantize_values(x, self.qparams(x))

    def effective_bits(self, shape) -> float:
        zb = 0 if self.symmetric else self.zero_bits
        return effective_bits(self.bits, _numel(shape), n_blocks(tuple(shape), self.granularity), self.scale_bits, zb)

    def error_bound(self, x: torch.Tensor) -> float:
        """Worst |x − x̂| over values inside the range: the largest |scale| / 2."""
        qp = self.qparams(x)
        return float(qp.scale.float().abs().max()) / 2 if qp.scale.numel() else 0.0


@dataclass(frozen=True)
class FP4Format:
    """E2M1 with a block scale: ``fp16`` per 32, ``e8m0`` (MXFP4) per 32, ``e4m3`` (NVFP4) per 16."""

    scale_kind: str = "fp16"

    @property
    def block(self) -> int:
        return 16 if self.scale_kind == "e4m3" else 32

    @property
    def name(self) -> str:
        return {"fp16": "FP4 E2M1 fp16/32", "e8m0": "MXFP4 (E8M0/32)", "e4m3": "NVFP4 (E4M3/16)"}[self.scale_kind]

    def fake_quantize(self, x: torch.Tensor) -> torch.Tensor:
        return fp4_dequantize(fp4_quantize(x, self.scale_kind, self.block), x.dtype)

    def effective_bits(self, shape) -> float:
        numel = _numel(shape)
        sb = {"fp16": 16, "e8m0": 8, "e4m3": 8}[self.scale_kind]
        bits = effective_bits(4, numel, n_blocks(tuple(shape), PerGroup(self.block)), sb)
        return bits + (32 / numel if self.scale_kind == "e4m3" and numel else 0.0)

    def error_bound(self, x: torch.Tensor) -> float:
        """The widest E2M1 gap is 4→6, so a value in range is off by at most 1 · scale."""
        q = fp4_quantize(x, self.scale_kind, self.block)
        eff = q.scale * (q.global_scale if q.global_scale is not None else 1.0)
        return float(eff.max()) if eff.numel() else 0.0


@dataclass(frozen=True)
class FP8Format:
    """FP8 E4M3 or E5M2 with a float32 scale per tensor (or per channel)."""

    kind: str = "e4m3"
    granularity: Granularity = field(default_factory=PerTensor)

    @property
    def name(self) -> str:
        return f"FP8 {self.kind.upper()} {self.granularity.name()}"

    def fake_quantize(self, x: torch.Tensor) -> torch.Tensor:
        q, s = fp8_quantize(x, self.kind, self.granularity)
        return fp8_dequantize(q, s, self.granularity, x.dtype)

    def effective_bits(self, shape) -> float:
        return effective_bits(8, _numel(shape), n_blocks(tuple(shape), self.granularity), 32)

    def error_bound(self, x: torch.Tensor) -> float:
        """Half an ulp at the top binade: 2^(emax − mantissa bits − 1) · scale."""
        fi = torch.finfo(FP8_DTYPES[self.kind])
        mbits = 3 if self.kind == "e4m3" else 2
        emax = int(torch.log2(torch.tensor(fi.max)).floor())
        _, s = fp8_quantize(x, self.kind, self.granularity)
        return float(s.max()) * 2.0 ** (emax - mbits - 1) if s.numel() else 0.0


Format = IntFormat | FP4Format | FP8Format


def row_granularity(kind: str) -> Granularity:
    """'Per channel' of a weight is its output row; of an activation, its token."""
    return PerChannel(0) if kind == "weight" else PerToken()
