"""Kernel-agnostic plain tensors of one quantized linear, and how to get them.

Kernels never see modules: they take a :class:`LinearParams` (signed integer weight codes,
float32 group scales, INT8 outlier columns, the activation recipe), all views of one
:class:`lowbit.formats.quantized_weight.QuantizedWeight` (``from_quantized_weight``).
``from_quant_linear`` reads a :class:`lowbit.nn.QuantLinear`'s; ``from_float`` quantizes a float
weight by RTN (for benchmarks and tests), so both give the same tensors the reference path computes with.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lowbit.errors import LowbitError
from lowbit.formats.grid import dequantize_groups, n_groups
from lowbit.formats.quantized_weight import QuantizedWeight, dequantize_outliers, rtn
from lowbit.formats.scheme import WeightArgs

KINDS = ("w4a16", "w8a16", "w8a8", "w4a4")


class KernelError(LowbitError, RuntimeError):
    """A kernel cannot run these parameters or this device (the message says why)."""


class NonFiniteActivations(ValueError):
    """Activations holding NaN or Inf, which no integer code represents (an A8/A4 kernel's input)."""

    def __init__(self, msg: str = "activations contain NaN or Inf: they have no integer code"):
        super().__init__(msg)


@dataclass(frozen=True)
class ActSpec:
    """Dynamic per-token symmetric INT activations: ``bits`` in groups of ``group`` (0 = whole
    row) over the normal channels, scaled by ``scale_rule`` (``lowbit.formats.absmax``: the signed
    absmax, or compressed-tensors' absmax over half the range) times ``clip``; outliers INT8 per
    token on the signed rule."""

    bits: int
    group: int
    clip: float = 1.0
    scale_rule: str = "signed"

    @property
    def half_range(self) -> bool:
        """The native kernels' flag for compressed-tensors' rule."""
        return self.scale_rule == "compressed-tensors"


@dataclass
class LinearParams:
    kind: str
    codes: torch.Tensor  # int8 signed [out, n_normal] (symmetric) or uint8 (asymmetric, with zero)
    scale: torch.Tensor  # float32 [out, n_groups]
    zero: torch.Tensor | None  # int32 [out, n_groups], asymmetric weights only
    group: int  # weight group along the input (0 = whole row)
    outlier: torch.Tensor  # int8 [out, k]
    outlier_scale: torch.Tensor  # float32 [out]
    act: ActSpec | None
    bias: torch.Tensor | None = None

    @property
    def out_features(self) -> int:
        return self.codes.shape[0]

    @property
    def n_normal(self) -> int:
        return self.codes.shape[1]

    @property
    def n_outliers(self) -> int:
        return self.outlier.shape[1]

    @property
    def in_features(self) -> int:
        return self.n_normal + self.n_outliers

    def check(self) -> "LinearParams":
        """``self``, or ValueError where the tensors disagree in size: every kernel's prepare sizes
        its buffers and reads from them (scales of more rows than the codes, or zero points of fewer
        groups than the scales, were read past by the native kernels)."""
        if self.codes.dim() != 2 or self.outlier.dim() != 2 or self.group < 0:
            raise ValueError(f"{self.kind} params: codes and outlier codes must be [out, channels] and the group "
                             f">= 0, got {tuple(self.codes.shape)}, {tuple(self.outlier.shape)}, group {self.group}")
        out, n = self.codes.shape
        groups = (out, n_groups(n, self.group))
        want = {"scale": groups, "zero": groups, "outlier": (out, self.n_outliers), "outlier_scale": (out,),
                "bias": (out,)}
        for name, shape in want.items():
            t = getattr(self, name)
            if t is not None and tuple(t.shape) != shape:
                raise ValueError(f"{self.kind} params: {name} must be {list(shape)} for codes {[out, n]} in groups "
                                 f"of {self.group or n}, got {list(t.shape)}")
        return self

    def to(self, device: torch.device | str) -> "LinearParams":
        mv = lambda t: None if t is None else t.to(device)  # noqa: E731
        return LinearParams(self.kind, mv(self.codes), mv(self.scale), mv(self.zero), self.group, mv(self.outlier),
                            mv(self.outlier_scale), self.act, mv(self.bias))

    def dequantize(self) -> torch.Tensor:
        """``[out, in]`` float32 weight (normal channels, then outliers)."""
        w = dequantize_groups(self.codes, self.scale, self.zero, self.group)
        return torch.cat([w, dequantize_outliers(self.outlier, self.outlier_scale)], dim=1)


def kind_of(w_bits: int, act: ActSpec | None) -> str:
    if w_bits == 4 and act is None:
        return "w4a16"
    if w_bits == 8 and act is None:
        return "w8a16"
    if w_bits == 8 and act is not None and act.bits == 8:
        return "w8a8"
    if w_bits == 4 and act is not None and act.bits == 4:
        return "w4a4"
    raise KernelError(f"no kernel kind for W{w_bits}A{act.bits if act else 16}")


def from_quant_linear(ql) -> LinearParams:
    """Plain tensors of a ``QuantLinear`` (integer grid only). The input permutation, if the
    module has one, is *not* applied here: the caller index-selects ``x`` first (as forward does)."""
    lay = ql.layout
    if lay.w_bits == 16 or lay.w_format != "int":
        raise KernelError(f"QuantLinear W{lay.w_bits} {lay.w_format}: no integer kernel, use its reference forward")
    if lay.outlier_precision != "int8":
        raise KernelError("kernels support INT8 outlier channels only (this layer keeps them in FP16)")
    act = None
    if ql.act_args is not None:
        a = ql.act_args
        if a.format != "int" or not a.symmetric:
            raise KernelError(f"kernels support symmetric INT activations only, got {a.format} symmetric={a.symmetric}")
        act = ActSpec(a.bits, a.group_size, a.clip_ratio, a.scale_rule)
    return from_quantized_weight(ql.quantized_weight(), kind_of(lay.w_bits, act), act,
                                 None if ql.bias is None else ql.bias.float())


def from_quantized_weight(qw: QuantizedWeight, kind: str, act: ActSpec | None,
                          bias: torch.Tensor | None = None) -> LinearParams:
    """The kernels' tensors as views of ``qw``: signed codes (symmetric) or unsigned codes and
    zeros (asymmetric), float32 group scales, the INT8 outlier block."""
    if qw.grid.symmetric:
        codes, zero = qw.signed_codes(), None
    else:
        codes, zero = qw.codes, qw.zero.to(torch.int32)
    outlier, outlier_scale = qw.int8_outliers()
    return LinearParams(kind, codes, qw.scale.float(), zero, qw.group, outlier, outlier_scale, act, bias)


def from_float(weight: torch.Tensor, kind: str, *, group: int = 128, n_outliers: int = 0,
               act_clip: float = 1.0, bias: torch.Tensor | None = None) -> LinearParams:
    """RTN-quantize ``weight [out, in]`` (last ``n_outliers`` columns INT8) for ``kind``."""
    if kind not in KINDS:
        raise KernelError(f"unknown kernel kind {kind!r}; kinds: {', '.join(KINDS)}")
    bits = 4 if kind in ("w4a16", "w4a4") else 8
    g = group if bits == 4 else 0
    if kind != "w4a4" and n_outliers:
        raise KernelError(f"{kind} has no outlier channels")
    qw = rtn(weight.float(), WeightArgs(bits=bits, group_size=g, symmetric=True), n_outliers, "int8")
    act = {"w4a16": None, "w8a16": None, "w8a8": ActSpec(8, 0), "w4a4": ActSpec(4, g, act_clip)}[kind]
    return from_quantized_weight(qw, kind, act, None if bias is None else bias.float())
