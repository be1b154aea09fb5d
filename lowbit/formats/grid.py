"""Number grids with one scale per row of a ``[m, L]`` block matrix: INT (symmetric or
asymmetric, via ``lowbit.formats``) and FP4 E2M1. Codes are always unsigned (ready to pack).

Weights keep FP16 scales (what is stored is what is simulated); activations use FP32 scales.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lowbit.formats.absmax import rule_scale
from lowbit.formats.affine import _safe_scale  # the formats' own scale storage rule (shared on purpose)
from lowbit.formats import PerToken, QParams, choose_qparams, dequantize, e2m1_decode, e2m1_encode, quantize

CLIP_SEARCH = (1.0, 0.95, 0.9, 0.85, 0.8, 0.75)


@dataclass(frozen=True)
class Grid:
    bits: int
    symmetric: bool = True
    fmt: str = "int"  # "int" | "fp4"
    scale_dtype: torch.dtype = torch.float16
    scale_rule: str = "signed"  # symmetric INT: lowbit.formats.absmax.SCALE_RULES

    @property
    def offset(self) -> int:
        """Added to signed codes so they are stored unsigned."""
        return 2 ** (self.bits - 1) if (self.fmt == "int" and self.symmetric) else 0

    def signed(self, codes: torch.Tensor) -> torch.Tensor:
        """int8 ``codes - offset``: a symmetric INT grid's stored codes as the signed integers they mean."""
        return (codes.to(torch.int16) - self.offset).to(torch.int8)

    def _qparams(self, scale: torch.Tensor, zero: torch.Tensor | None) -> QParams:
        return QParams(scale, zero, self.bits, self.symmetric, True, PerToken())

    def fit(self, blocks: torch.Tensor, clip: float = 1.0) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Scale (float32 holding ``scale_dtype`` values) and zero point (int32 or None) per row."""
        if blocks.shape[-1] == 0:  # no columns (e.g. no outlier channels): unit scales
            z = None if self.symmetric or self.fmt == "fp4" else blocks.new_zeros(blocks.shape[0], dtype=torch.int32)
            return blocks.new_ones(blocks.shape[0]), z
        if self.fmt == "fp4":
            amax = blocks.abs().amax(dim=1) * clip
            scale = (amax / 6.0).to(self.scale_dtype).float()
            return torch.where(scale == 0, torch.ones_like(scale), scale), None
        if self.symmetric and self.scale_rule != "signed":
            return self.fit_fast(blocks, clip)
        qp = choose_qparams(blocks, self.bits, symmetric=self.symmetric, granularity=PerToken(),
                            clip_ratio=clip, scale_dtype=self.scale_dtype)
        return qp.scale.float(), qp.zero_point

    def encode(self, blocks: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None) -> torch.Tensor:
        if blocks.shape[-1] == 0:
            return blocks.new_zeros(blocks.shape, dtype=torch.uint8)
        if self.fmt == "fp4":
            return e2m1_encode(blocks.float() / scale[:, None])
        q = quantize(blocks, self._qparams(scale, zero))
        return (q.to(torch.int16) + self.offset).to(torch.uint8)

    def decode(self, codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None) -> torch.Tensor:
        if codes.shape[-1] == 0:
            return codes.new_zeros(codes.shape, dtype=torch.float32)
        if self.fmt == "fp4":
            return e2m1_decode(codes) * scale.float()[:, None]
        signed = codes.to(torch.int16) - self.offset
        signed = signed.to(torch.int8) if self.symmetric else signed.to(torch.uint8)
        return dequantize(signed, self._qparams(scale, zero), torch.float32)

    def fit_fast(self, blocks: torch.Tensor, clip: float = 1.0) -> tuple[torch.Tensor, torch.Tensor | None]:
        """:meth:`fit` without input checks, for per-token activation scales on every forward
        (symmetric INT and FP4; asymmetric falls back to :meth:`fit`). Tested equal to it."""
        if self.fmt == "fp4" or not self.symmetric or blocks.shape[-1] == 0:
            return self.fit(blocks, clip)
        return _safe_scale(rule_scale(blocks, self.bits, clip, self.scale_rule), self.scale_dtype).float(), None

    def qdq_fast(self, x: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(codes, values) of a ``[rows, c]`` slice with per-row scales, without input checks.

        GPTQ calls this once per column; it must equal ``encode``/``decode`` (tested)."""
        s = scale[:, None]
        if self.fmt == "fp4":
            c = e2m1_encode(x / s)
            return c, e2m1_decode(c) * s
        if self.symmetric:
            lo, hi = -(2 ** (self.bits - 1)), 2 ** (self.bits - 1) - 1
            q = torch.round(x / s).clamp_(lo, hi)
            return (q + self.offset).to(torch.uint8), q * s
        z = zero[:, None].float()
        q = (torch.round(x / s) + z).clamp_(0, 2 ** self.bits - 1)
        return q.to(torch.uint8), (q - z) * s

    def fit_search(self, blocks: torch.Tensor, ratios: tuple[float, ...],
                   weights: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Per row, the clip ratio (of ``ratios``) whose round trip has the smallest squared error,
        each column's error times ``weights`` (``[L]`` or per row ``[m, L]``) when given."""
        best_s, best_z, best_e = None, None, None
        for r in ratios:
            s, z = self.fit(blocks, r)
            err = (self.decode(self.encode(blocks, s, z), s, z) - blocks).pow(2)
            err = (err * weights if weights is not None else err).sum(dim=1)
            if best_e is None:
                best_s, best_z, best_e = s, z, err
                continue
            better = err < best_e
            best_s = torch.where(better, s, best_s)
            if z is not None:
                best_z = torch.where(better, z, best_z)
            best_e = torch.where(better, err, best_e)
        return best_s, best_z


def to_groups(x: torch.Tensor, group: int) -> torch.Tensor:
    """``[rows, n]`` → ``[rows * n_groups, group]`` (a ragged tail padded with zeros)."""
    rows, n = x.shape
    g = group or n or 1
    pad = (-n) % g
    if pad:
        x = torch.nn.functional.pad(x, (0, pad))
    return x.reshape(rows * ((n + pad) // g), g)


def from_groups(blocks: torch.Tensor, rows: int, n: int) -> torch.Tensor:
    """Inverse of :func:`to_groups`: ``[rows * n_groups, group]`` → ``[rows, n]`` (tail dropped)."""
    if rows == 0:
        return blocks.new_empty(0, n)
    return blocks.reshape(rows, -1)[:, :n]


def expand_groups(per_group: torch.Tensor, group: int, n: int) -> torch.Tensor:
    """``[rows, n_groups]`` (one value per group) → ``[rows, n]``, each value over its group's columns."""
    return per_group.repeat_interleave(group or n, dim=1)[:, :n]


def dequantize_groups(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None,
                      group: int) -> torch.Tensor:
    """float32 ``(codes - zero) · scale`` of integer codes ``[rows, n]`` (signed, or unsigned with
    ``zero``) with ``scale``/``zero`` ``[rows, n_groups]``: every integer dequantize of a group layout."""
    rows, n = codes.shape
    if n == 0:
        return codes.new_zeros(rows, 0, dtype=torch.float32)
    z = None if zero is None else zero.reshape(-1).to(torch.int32)
    qp = QParams(scale.reshape(-1).float(), z, 8, zero is None, True, PerToken())
    return from_groups(dequantize(to_groups(codes, group), qp, torch.float32), rows, n)


def n_groups(n: int, group: int) -> int:
    return -(-n // (group or n)) if n else 0
