"""A quantized ``[out, in]`` weight as data, and round-to-nearest: groups of codes and scales,
the last ``k`` input columns (the reordered outlier channels) kept in INT8 or FP16.

Every consumer derives its view from this one type: ``nn.QuantLinear`` packs it, the kernels
prepare their layouts from it, export writes it in compressed-tensors' names.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lowbit.errors import LowbitError
from lowbit.formats.grid import CLIP_SEARCH, Grid, from_groups, to_groups
from lowbit.formats.packing import pack, unpack
from lowbit.formats.scheme import WeightArgs

INT8 = Grid(8, True, "int", torch.float16)


class WeightViewError(LowbitError, ValueError):
    """A quantized weight has no such view (e.g. signed codes of an asymmetric or FP4 grid)."""


@dataclass
class QuantizedWeight:
    """Codes and scales of a ``[out, in]`` weight whose last ``n_outliers`` columns are outliers."""

    codes: torch.Tensor  # uint8 [out, n_normal], unsigned codes
    scale: torch.Tensor  # float32 holding fp16 values [out, n_groups]
    zero: torch.Tensor | None  # int32 [out, n_groups] (asymmetric only)
    outlier: torch.Tensor  # int8 codes [out, k] (int8) or fp16 values (fp16)
    outlier_scale: torch.Tensor | None  # float32 holding fp16 values [out] (int8 only)
    grid: Grid
    group: int

    @property
    def n_outliers(self) -> int:
        return self.outlier.shape[1]

    def signed_codes(self) -> torch.Tensor:
        """int8 ``codes - offset`` of a symmetric INT grid: what integer kernels multiply."""
        if self.grid.fmt != "int" or not self.grid.symmetric:
            raise WeightViewError(f"signed codes need a symmetric INT grid, this one is "
                                  f"{self.grid.fmt} symmetric={self.grid.symmetric}")
        return self.grid.signed(self.codes)

    def packed_codes(self) -> torch.Tensor:
        """uint8 ``[out, packed_size(n_normal, bits)]``: the codes packed as ``formats.pack`` lays them."""
        return pack(self.codes, self.grid.bits)

    def int8_outliers(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(int8 codes ``[out, k]``, float32 scales ``[out]``) of INT8 outlier columns; a weight
        without outliers gives ``[out, 0]`` codes and unit scales."""
        out = self.codes.shape[0]
        if self.outlier.shape[1] and self.outlier_scale is None:
            raise WeightViewError("this weight keeps its outlier columns in FP16, not INT8")
        dev = self.codes.device
        codes = self.outlier if self.outlier.shape[1] else torch.zeros(out, 0, dtype=torch.int8, device=dev)
        scale = self.outlier_scale if self.outlier_scale is not None else torch.ones(out, device=dev)
        return codes, scale.float()

    @classmethod
    def from_packed(cls, packed: torch.Tensor, n_normal: int, scale: torch.Tensor, zero: torch.Tensor | None,
                    outlier: torch.Tensor, outlier_scale: torch.Tensor | None, grid: Grid,
                    group: int) -> "QuantizedWeight":
        """Inverse of :meth:`packed_codes` plus the stored (fp16 / uint8) scales and zeros."""
        return cls(unpack(packed, grid.bits, n_normal), scale.float(), None if zero is None else zero.to(torch.int32),
                   outlier, None if outlier_scale is None else outlier_scale.float(), grid, group)

    def dequantize(self) -> torch.Tensor:
        out, n = self.codes.shape
        g = self.group or n
        blocks = to_groups(self.codes, g)
        s = self.scale.reshape(-1)
        z = self.zero.reshape(-1) if self.zero is not None else None
        normal = from_groups(self.grid.decode(blocks, s, z), out, n) if n else self.codes.new_zeros(out, 0).float()
        return torch.cat([normal, dequantize_outliers(self.outlier, self.outlier_scale)], dim=1)


def split_rows(qw: QuantizedWeight, sizes: list[int]) -> list[QuantizedWeight]:
    """Undo stacking several weights' rows (linears that share an input share GPTQ's Hessian,
    and GPTQ treats rows independently, so they can be quantized in one sweep)."""
    out, start = [], 0
    for n in sizes:
        sl = slice(start, start + n)
        out.append(QuantizedWeight(qw.codes[sl], qw.scale[sl], qw.zero[sl] if qw.zero is not None else None,
                                   qw.outlier[sl], qw.outlier_scale[sl] if qw.outlier_scale is not None else None,
                                   qw.grid, qw.group))
        start += n
    return out


def dequantize_outliers(outlier: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    if scale is None:
        return outlier.float()
    return outlier.float() * scale.float()[:, None]


def weight_grid(args: WeightArgs) -> Grid:
    return Grid(args.bits, args.symmetric, args.format, torch.float16)


def _ratios(args: WeightArgs) -> tuple[float, ...]:
    default = args.clip_min == 0.75 and args.clip_steps == len(CLIP_SEARCH)
    return tuple(r * args.clip_ratio for r in (CLIP_SEARCH if default else args.clip_ratios))


def fit_grid(grid: Grid, blocks: torch.Tensor, args: WeightArgs, importance: torch.Tensor | None = None):
    """Scales for ``[rows, L]`` blocks. ``importance`` (``[L]`` or per block ``[rows, L]``: the
    inputs' energy diag XᵀX of these columns) weights the clipping search's error when
    ``args.clip_weighted``: a clipped column that sees large inputs costs more output error than
    one that sees small ones."""
    if args.clip_search:
        w = importance if (args.clip_weighted and importance is not None) else None
        return grid.fit_search(blocks, _ratios(args), w)
    return grid.fit(blocks, args.clip_ratio)


def quantize_outliers(cols: torch.Tensor, precision: str):
    if precision == "fp16":
        return cols.half(), None
    s, _ = INT8.fit(cols)
    codes = INT8.encode(cols, s, None)
    return INT8.signed(codes), s


def rtn(w: torch.Tensor, args: WeightArgs, n_outliers: int = 0, outlier_precision: str = "int8",
        importance: torch.Tensor | None = None) -> QuantizedWeight:
    """Round-to-nearest in groups along the input dim. ``importance`` (``[n_in]``, diag XᵀX of the
    calibration inputs) weights the clipping search when ``args.clip_weighted``."""
    w = w.float()
    out, n_in = w.shape
    n = n_in - n_outliers
    grid, g = weight_grid(args), args.group_size or n
    normal = w[:, :n]
    if n:
        blocks = to_groups(normal, g)
        per_block = None  # each group's column energies, the same for every row; built only for a weighted search
        if importance is not None and args.clip_search and args.clip_weighted:
            per_block = to_groups(importance.float()[None, :n], g).repeat(out, 1)
        s, z = fit_grid(grid, blocks, args, per_block)
        codes = from_groups(grid.encode(blocks, s, z), out, n)
        scale = s.reshape(out, -1)
        zero = z.reshape(out, -1) if z is not None else None
    else:
        codes, scale, zero = w.new_zeros(out, 0, dtype=torch.uint8), w.new_zeros(out, 0), None
    oc, os_ = quantize_outliers(w[:, n:], outlier_precision)
    return QuantizedWeight(codes, scale, zero, oc, os_, grid, args.group_size)
