"""``KernelLinear``: a drop-in for :class:`lowbit.nn.QuantLinear` whose forward runs the
dispatched kernel on tensors prepared once, and ``accelerate(model)`` to swap them all in.

Layers the kernels cannot run (FP4 grids, FP16 outliers, float weights) keep their own
reference forward; ``accelerate`` returns how many of each it swapped.
"""

from __future__ import annotations

from collections import Counter

import torch
from torch import nn

from .dispatch import PreparedLinear, prepare
from .params import KernelError, from_quant_linear


class KernelLinear(nn.Module):
    def __init__(self, prepared: PreparedLinear, in_features: int, out_features: int,
                 input_perm: torch.Tensor | None, weight_bytes: int):
        super().__init__()
        self.prepared = prepared
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("input_perm", input_perm)
        self.weight_bytes = weight_bytes

    @classmethod
    def from_quant_linear(cls, ql: nn.Module, kernel: str | None = None) -> "KernelLinear":
        from lowbit.nn.quant_linear import module_bytes

        p = from_quant_linear(ql)
        dev = ql.qweight.device
        return cls(prepare(p, dev, kernel), ql.in_features, ql.out_features,
                   None if ql.input_perm is None else ql.input_perm.clone(), module_bytes(ql))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x if x.dim() == 2 else x.reshape(-1, shape[-1])
        if self.input_perm is not None:
            x2 = x2.index_select(1, self.input_perm)
        y = self.prepared(x2)
        if y.dim() != len(shape):
            y = y.reshape(*shape[:-1], self.out_features)
        return y if y.dtype == x.dtype else y.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.in_features}->{self.out_features}, {self.prepared.kind} via {self.prepared.kernel}"


def accelerate(model: nn.Module, kernel: str | None = None) -> Counter:
    """Replace every ``QuantLinear`` the kernels support by a ``KernelLinear`` (in place)."""
    from lowbit.nn.quant_linear import QuantLinear

    counts: Counter = Counter()
    for name, mod in list(model.named_modules()):
        if not isinstance(mod, QuantLinear):
            continue
        try:
            new = KernelLinear.from_quant_linear(mod, kernel)
        except KernelError:
            counts["kept_reference"] += 1
            continue
        parent = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
        setattr(parent, name.rsplit(".", 1)[-1], new)
        counts[f"{new.prepared.kind}:{new.prepared.kernel}"] += 1
    return counts
