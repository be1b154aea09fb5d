"""Dynamic per-token activation quantization: groups over the normal channels, one INT8 (or
FP16) block for the trailing outlier channels. Returns real codes and scales."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lowbit.formats.grid import Grid, from_groups, to_groups
from lowbit.formats.scheme import ActArgs
from lowbit.formats.quantized_weight import INT8, dequantize_outliers

ACT_INT8 = Grid(8, True, "int", torch.float32)


@dataclass
class QuantizedActivation:
    codes: torch.Tensor  # uint8 [tokens, n_normal]
    scale: torch.Tensor  # float32 [tokens * n_groups]
    zero: torch.Tensor | None
    outlier: torch.Tensor  # int8 codes [tokens, k] or fp16 values
    outlier_scale: torch.Tensor | None  # float32 [tokens]
    grid: Grid
    group: int

    def dequantize(self) -> torch.Tensor:
        t, n = self.codes.shape
        normal = from_groups(self.grid.decode(to_groups(self.codes, self.group or n), self.scale, self.zero), t, n) \
            if n else self.scale.new_zeros(t, 0)
        return torch.cat([normal, dequantize_outliers(self.outlier, self.outlier_scale)], dim=1)


def act_grid(args: ActArgs) -> Grid:
    return Grid(args.bits, args.symmetric, args.format, torch.float32, args.scale_rule)


def quantize_activation(x: torch.Tensor, args: ActArgs, n_outliers: int = 0,
                        outlier_precision: str = "int8") -> QuantizedActivation:
    """``x``: ``[tokens, in]`` already in reordered channel order (outliers last)."""
    x = x.float()
    t, n_in = x.shape
    n = n_in - n_outliers
    grid = act_grid(args)
    g = args.group_size or n
    if n:
        blocks = to_groups(x[:, :n], g)
        s, z = grid.fit_fast(blocks, args.clip_ratio)
        codes = from_groups(grid.qdq_fast(blocks, s, z)[0], t, n)
    else:
        codes, s, z = x.new_zeros(t, 0, dtype=torch.uint8), x.new_zeros(0), None
    cols = x[:, n:]
    if outlier_precision == "fp16":
        oc, os_ = cols.half(), None
    else:
        os_, _ = ACT_INT8.fit_fast(cols)
        oc = ACT_INT8.signed(ACT_INT8.qdq_fast(cols, os_, None)[0])
    return QuantizedActivation(codes, s, z, oc, os_, grid, args.group_size)


__all__ = ["QuantizedActivation", "quantize_activation", "act_grid", "INT8"]
