"""A linear layer stored packed: low-bit weight codes, FP16 group scales, INT8 outlier columns
and (when the graph cannot absorb it) the input-channel permutation.

Its forward quantizes the activations for real (per token, in groups) and computes from the
codes with :func:`reference_quant_matmul`. The layout (everything but the tensors) is a small
JSON-able dict, so a saved checkpoint can rebuild empty modules before loading the tensors.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import torch
from torch import nn

from lowbit.formats import packed_size
from lowbit.formats.grid import Grid, n_groups
from lowbit.formats.scheme import ActArgs
from lowbit.formats.quantized_weight import QuantizedWeight
from lowbit.kernels.channel_order import permute_channels

from lowbit.nn.quantized_activation import quantize_activation
from .online_hadamard import transform_from_dict
from .reference_matmul import reference_quant_matmul


@dataclass(frozen=True)
class QuantLinearLayout:
    in_features: int
    out_features: int
    n_outliers: int
    w_bits: int
    w_group: int
    w_symmetric: bool
    w_format: str
    outlier_precision: str
    has_input_perm: bool
    has_bias: bool
    act: dict | None  # ActArgs as a dict, None = activations stay float
    input_transform: dict | None = None  # an online transform of the input (lowbit.nn.online_hadamard), None = none

    @property
    def n_normal(self) -> int:
        return self.in_features - self.n_outliers

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "QuantLinearLayout":
        return cls(**d)


class QuantLinear(nn.Module):
    def __init__(self, layout: QuantLinearLayout):
        super().__init__()
        self.layout = layout
        self.in_features, self.out_features = layout.in_features, layout.out_features
        self.grid = Grid(layout.w_bits, layout.w_symmetric, layout.w_format, torch.float16) if layout.w_bits < 16 else None
        self.act_args = ActArgs(**layout.act) if layout.act is not None else None
        self.input_transform = transform_from_dict(layout.input_transform) if layout.input_transform else None
        n, out, k = layout.n_normal, layout.out_features, layout.n_outliers
        if layout.w_bits == 16:  # float weights (activation-only schemes and ablations)
            self.register_buffer("fweight", torch.zeros(out, layout.in_features))
            self.register_buffer("input_perm", torch.arange(layout.in_features) if layout.has_input_perm else None)
            self.register_buffer("bias", torch.zeros(out) if layout.has_bias else None)
            return
        ng = n_groups(n, layout.w_group)
        self.register_buffer("qweight", torch.zeros(out, packed_size(n, layout.w_bits), dtype=torch.uint8))
        self.register_buffer("wscale", torch.zeros(out, ng, dtype=torch.float16))
        self.register_buffer("wzero", torch.zeros(out, ng, dtype=torch.uint8) if not self.grid.symmetric and layout.w_format == "int" else None)
        odt = torch.int8 if layout.outlier_precision == "int8" else torch.float16
        self.register_buffer("outlier_weight", torch.zeros(out, k, dtype=odt))
        self.register_buffer("outlier_scale", torch.zeros(out, dtype=torch.float16) if layout.outlier_precision == "int8" else None)
        self.register_buffer("input_perm", torch.arange(layout.in_features) if layout.has_input_perm else None)
        self.register_buffer("bias", torch.zeros(out) if layout.has_bias else None)

    @classmethod
    def from_float(cls, weight: torch.Tensor, act: ActArgs | None, input_perm: torch.Tensor | None,
                   bias: torch.Tensor | None, n_outliers: int, outlier_precision: str) -> "QuantLinear":
        """Float weights (already in the reordered input order), quantized activations."""
        out, n_in = weight.shape
        layout = QuantLinearLayout(n_in, out, n_outliers, 16, 0, True, "int", outlier_precision,
                                   input_perm is not None, bias is not None,
                                   asdict(act) if act is not None and act.enabled else None)
        m = cls(layout)
        m.fweight.copy_(weight.detach().float())
        if input_perm is not None:
            m.input_perm.copy_(input_perm)
        if bias is not None:
            m.bias.copy_(bias.detach().float())
        return m.to(weight.device)

    @classmethod
    def from_quantized(cls, qw: QuantizedWeight, act: ActArgs | None, input_perm: torch.Tensor | None,
                       bias: torch.Tensor | None, outlier_precision: str) -> "QuantLinear":
        out, n = qw.codes.shape
        layout = QuantLinearLayout(
            in_features=n + qw.n_outliers, out_features=out, n_outliers=qw.n_outliers,
            w_bits=qw.grid.bits, w_group=qw.group, w_symmetric=qw.grid.symmetric, w_format=qw.grid.fmt,
            outlier_precision=outlier_precision, has_input_perm=input_perm is not None,
            has_bias=bias is not None, act=asdict(act) if act is not None and act.enabled else None,
        )
        m = cls(layout)
        m.qweight.copy_(qw.packed_codes())
        m.wscale.copy_(qw.scale.half())
        if m.wzero is not None:
            m.wzero.copy_(qw.zero.to(torch.uint8))
        m.outlier_weight.copy_(qw.outlier)
        if m.outlier_scale is not None:
            m.outlier_scale.copy_(qw.outlier_scale.half())
        if input_perm is not None:
            m.input_perm.copy_(input_perm)
        if bias is not None:
            m.bias.copy_(bias.detach().float())
        return m.to(qw.codes.device)

    def with_input_transform(self, t: nn.Module) -> "QuantLinear":
        """Rotate the input online (before or after the permutation, ``t.before_perm``; always
        before the activation quantizer); the weights must already hold the matching rotation."""
        if t.n != self.in_features:
            raise ValueError(f"an input transform of order {t.n} on a linear with {self.in_features} inputs")
        self.layout = replace(self.layout, input_transform=t.to_dict())
        self.input_transform = t
        return self

    def quantized_weight(self) -> QuantizedWeight:
        """The packed buffers as the one weight type every kernel and exporter reads."""
        return QuantizedWeight.from_packed(self.qweight, self.layout.n_normal, self.wscale, self.wzero,
                                           self.outlier_weight, self.outlier_scale, self.grid, self.layout.w_group)

    def dequantized_weight(self) -> torch.Tensor:
        """``[out, in]`` float32 in the reordered input order."""
        if self.layout.w_bits == 16:
            return self.fweight
        return self.quantized_weight().dequantize()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        t = self.input_transform
        if t is not None and t.before_perm:
            x2 = t(x2.float())
        if self.input_perm is not None:
            x2 = permute_channels(x2, self.input_perm)
        if t is not None and not t.before_perm:
            x2 = t(x2.float())
        a = x2
        if self.act_args is not None:
            a = quantize_activation(x2, self.act_args, self.layout.n_outliers, self.layout.outlier_precision)
        y = reference_quant_matmul(a, self.dequantized_weight(), self.bias)
        return y.reshape(*shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        l = self.layout
        a = f"A{self.act_args.bits}" if self.act_args else "A16"
        return (f"{l.in_features}->{l.out_features}, W{l.w_bits}{'' if l.w_format == 'int' else '-' + l.w_format} "
                f"g{l.w_group} {a}, outliers={l.n_outliers} ({l.outlier_precision}), perm={l.has_input_perm}"
                + (f", online {l.input_transform['kind']}" if l.input_transform else ""))



def module_bytes(module: nn.Module) -> int:
    """Bytes of all parameters and buffers (what the module really holds)."""
    seen, total = set(), 0
    for t in list(module.parameters()) + list(module.buffers()):
        key = id(t) if t.is_meta else t.data_ptr()  # meta tensors (layers still on disk) have no storage
        if key in seen:
            continue
        seen.add(key)
        total += t.numel() * t.element_size()
    return total
