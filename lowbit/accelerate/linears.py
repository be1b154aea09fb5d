"""``KernelLinear``: a drop-in for :class:`lowbit.nn.QuantLinear` whose forward runs the
dispatched kernel on tensors prepared once, and ``accelerate(model)`` to swap them all in.

Layers the kernels cannot run (FP4 grids, FP16 outliers, float weights) keep their own
reference forward; ``accelerate`` returns how many of each it swapped.
"""

from __future__ import annotations

from collections import Counter

import torch
from torch import nn

from lowbit.kernels.dispatch import PreparedLinear, prepare
from lowbit.kernels.linear_params import KernelError, from_quant_linear

from .online_input import input_steps, prepare_input


class KernelLinear(nn.Module):
    def __init__(self, prepared: PreparedLinear, in_features: int, out_features: int,
                 input_perm: torch.Tensor | None, weight_bytes: int, input_transform: nn.Module | None = None):
        super().__init__()
        self.prepared = prepared
        self.input_transform = input_transform  # an online Hadamard (lowbit.nn.online_hadamard)
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("input_perm", input_perm)
        self.weight_bytes = weight_bytes

    @classmethod
    def from_quant_linear(cls, ql: nn.Module, kernel: str | None = None, input_folded: bool = False) -> "KernelLinear":
        """``input_folded``: the layer before already writes x in the input permutation's order
        (:func:`.fuse.down_input_orders`), so the kernel reads it as it comes (a transform after
        the reorder still runs)."""
        from lowbit.nn.quant_linear import module_bytes

        in_kernel, outside, transform = input_steps(ql, input_folded)
        return cls(prepare(from_quant_linear(ql), ql.qweight.device, kernel, input_perm=in_kernel), ql.in_features,
                   ql.out_features, outside, module_bytes(ql), transform)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.prepared.batched(prepare_input(x, self.input_perm, self.input_transform))

    def extra_repr(self) -> str:
        return f"{self.in_features}->{self.out_features}, {self.prepared.kind} via {self.prepared.kernel}"


def accelerate(model: nn.Module, kernel: str | None = None, fuse: bool = True) -> Counter:
    """Replace every ``QuantLinear`` the kernels support by a ``KernelLinear`` (in place); with
    ``fuse``, linears that read one input (q/k/v, gate/up) first become one kernel call
    (:mod:`.fuse`, counted as ``fused_groups``), and a down_proj's input order moves into its
    gate/up rows where it can (``folded_orders``: :func:`.fuse.down_input_orders`)."""
    from lowbit.models.module_paths import get_path, set_path
    from lowbit.nn.quant_linear import QuantLinear

    from lowbit.accelerate import fuse as fusion

    counts: Counter = Counter()
    downs = fusion.down_input_orders(model) if fuse else {}
    for paths in fusion.shared_input_groups(model) if fuse else []:
        mods = [get_path(model, p) for p in paths]
        if not all(isinstance(m, QuantLinear) for m in mods):
            continue
        down_path, down = downs.get(tuple(paths)), None
        order = None
        if down_path is not None:  # down_proj first: its order moves upstream only if it runs on a kernel
            ql = get_path(model, down_path)
            try:
                down, order = KernelLinear.from_quant_linear(ql, kernel, input_folded=True), ql.input_perm
            except KernelError:
                pass
        try:
            parts = fusion.fuse(mods, kernel, out_order=order)
        except KernelError:
            continue  # swapped one by one below
        for path, part in zip(paths, parts):
            set_path(model, path, part)
        counts[f"{parts[0].prepared.kind}:{parts[0].prepared.kernel}"] += len(parts)
        counts["fused_groups"] += 1
        if down is not None:
            set_path(model, down_path, down)
            counts[f"{down.prepared.kind}:{down.prepared.kernel}"] += 1
            counts["folded_orders"] += 1
    for name, mod in list(model.named_modules()):
        if not isinstance(mod, QuantLinear):
            continue
        try:
            new = KernelLinear.from_quant_linear(mod, kernel)
        except KernelError:
            counts["kept_reference"] += 1
            continue
        set_path(model, name, new)
        counts[f"{new.prepared.kind}:{new.prepared.kernel}"] += 1
    return counts
