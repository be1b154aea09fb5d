"""One kernel call for linears that read the same input (q/k/v, gate/up), as serving engines do.

At batch 1 a small linear costs more in fixed overhead (Python, ctypes, thread wake-up, the
activation quantization) than in weight bytes: the default model's 7 linears per layer become
4 calls. The siblings' plain tensors are concatenated along the output (exact: every output
row is computed as before, with the same activation quantization, which never depends on the
weights), prepared once, and each sibling is replaced by a :class:`FusedPart` that returns its
slice of the shared result.

Contract: the first part called with an input computes every part; a sibling called next with
the *same tensor object* gets its slice. Any other pattern (another input, a part called twice)
recomputes, so the result is always that of the input given. Outside inference mode a tensor's
version counter also catches an in-place change between the calls (inference tensors have none;
no supported architecture changes the shared input between its projections).
"""

from __future__ import annotations

import torch
from torch import nn

from lowbit.kernels.dispatch import PreparedLinear, prepare
from lowbit.kernels.linear_params import KernelError, LinearParams, from_quant_linear

from .online_input import prepare_input, same_transform, split_perm


def concat_params(ps: list[LinearParams]) -> LinearParams:
    """Siblings' tensors stacked along the output; KernelError unless they share kind, input
    size, groups, outlier count and activation recipe."""
    a = ps[0]
    for p in ps[1:]:
        if (p.kind, p.n_normal, p.n_outliers, p.group, p.act) != (a.kind, a.n_normal, a.n_outliers, a.group, a.act):
            raise KernelError(f"cannot fuse {a.kind} {a.n_normal}+{a.n_outliers} g{a.group} with "
                              f"{p.kind} {p.n_normal}+{p.n_outliers} g{p.group}")
        if (p.zero is None) != (a.zero is None):
            raise KernelError("cannot fuse symmetric with asymmetric weights")
    cat = lambda ts: torch.cat(ts, dim=0)  # noqa: E731
    bias = None
    if any(p.bias is not None for p in ps):
        bias = cat([p.bias if p.bias is not None else torch.zeros(p.out_features) for p in ps])
    return LinearParams(a.kind, cat([p.codes for p in ps]), cat([p.scale for p in ps]),
                        None if a.zero is None else cat([p.zero for p in ps]), a.group,
                        cat([p.outlier for p in ps]), cat([p.outlier_scale for p in ps]), a.act, bias)


class SharedInput:
    """The fused kernel of a group and the last input's per-part results (not a module: its parts
    are, and they share it)."""

    def __init__(self, prepared: PreparedLinear, sizes: list[int], input_perm: torch.Tensor | None = None,
                 input_transform: nn.Module | None = None):
        self.prepared, self.sizes = prepared, sizes
        self.input_perm, self.input_transform = input_perm, input_transform  # what runs before the kernel
        self._x = None
        self._version = None
        self._parts: list[torch.Tensor | None] = []
        self._left = 0

    def part(self, x: torch.Tensor, i: int) -> torch.Tensor:
        parts = self._parts
        # same object, this part not taken yet, unchanged (version counters exist outside inference mode)
        if not (x is self._x and parts[i] is not None and (self._version is None or x._version == self._version)):
            self._compute(x)
            parts = self._parts
        y, parts[i] = parts[i], None
        self._left -= 1
        if not self._left:
            self._x = None  # every part taken: hold nothing between calls
        return y

    def _compute(self, x: torch.Tensor) -> None:
        y = self.prepared.batched(prepare_input(x, self.input_perm, self.input_transform))
        self._parts = list(y.split(self.sizes, dim=-1))
        self._left = len(self._parts)
        self._x, self._version = x, None if x.is_inference() else x._version


class FusedPart(nn.Module):
    """One sibling of a fused group: ``forward(x)`` is that linear's output."""

    def __init__(self, shared: SharedInput, index: int, in_features: int, out_features: int):
        super().__init__()
        self.shared, self.index = shared, index
        self.in_features, self.out_features = in_features, out_features

    @property
    def prepared(self) -> PreparedLinear:
        return self.shared.prepared

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.shared.part(x, self.index)

    def extra_repr(self) -> str:
        p = self.shared.prepared
        return (f"{self.in_features}->{self.out_features}, part {self.index + 1} of {len(self.shared.sizes)} "
                f"fused, {p.kind} via {p.kernel}")


def reorder_rows(p: LinearParams, order: torch.Tensor) -> LinearParams:
    """``p`` with output row ``i`` taken from row ``order[i]`` (each row computed as before)."""
    pick = lambda t: None if t is None else t.index_select(0, order)  # noqa: E731
    return LinearParams(p.kind, pick(p.codes), pick(p.scale), pick(p.zero), p.group, pick(p.outlier),
                        pick(p.outlier_scale), p.act, pick(p.bias))


def fuse(linears: list[nn.Module], kernel: str | None = None,
         out_order: torch.Tensor | None = None) -> list[FusedPart]:
    """``FusedPart`` replacements for QuantLinears that read one input (KernelError if they cannot
    share a kernel: different recipes, input permutations or online transforms). Equal transforms
    (the ``-rot`` presets' block Hadamard) run once for all. ``out_order``: every part's output
    channels come out in this order (:func:`down_input_orders`)."""
    transform = getattr(linears[0], "input_transform", None)
    if not all(same_transform(getattr(ql, "input_transform", None), transform) for ql in linears):
        raise KernelError("cannot fuse linears with different online input transforms")
    perms = [ql.input_perm for ql in linears]
    if any((p is None) != (perms[0] is None) or (p is not None and not torch.equal(p, perms[0])) for p in perms):
        raise KernelError("cannot fuse linears with different input permutations")
    ps = [from_quant_linear(ql) for ql in linears]
    if out_order is not None:
        ps = [reorder_rows(p, out_order.to(torch.int64)) for p in ps]
    in_kernel, outside = split_perm(None if perms[0] is None else perms[0].clone(), transform)
    fused = prepare(concat_params(ps), linears[0].qweight.device, kernel, input_perm=in_kernel)
    sizes = [p.out_features for p in ps]
    shared = SharedInput(fused, sizes, outside, transform)
    return [FusedPart(shared, i, ql.in_features, ql.out_features) for i, ql in enumerate(linears)]


def shared_input_groups(model: nn.Module) -> list[list[str]]:
    """Paths of the linears that every forward calls with one tensor (q/k/v; gate/up of dense
    MLPs), from the architecture adapter; [] for models it does not know."""
    from lowbit.models.adapters import UnsupportedArchitectureError, get_adapter

    try:
        adapter = get_adapter(model)
    except UnsupportedArchitectureError:
        return []
    groups = []
    for i, layer in enumerate(adapter.layers(model)):
        for g in adapter.groups(layer):
            # MoE expert linears share a norm but each sees its own tokens (not ``shared``): never fused
            if g.shared and len(g.linears) > 1:
                groups.append([f"model.layers.{i}.{p}" for p in g.linears])
    return groups


def down_input_orders(model: nn.Module) -> dict[tuple[str, ...], str]:
    """``{gate/up paths: down_proj path}`` of the dense MLPs whose down_proj reads its input through
    a permutation P (W4A4's outlier reorder) that can move into gate/up instead: the MLP multiplies
    act(gate) and up channel by channel, so gate/up rows reordered by P hand down_proj its input in
    P's order already (the same values), and it reads it without a gather, as vLLM's plugin does.
    Not where down_proj has an online transform that runs before P, or the widths differ (one
    after P, the ``-rot`` presets' block Hadamard, still runs on the input as it comes)."""
    from lowbit.models.adapters import UnsupportedArchitectureError, get_adapter
    from lowbit.models.module_paths import get_path
    from lowbit.nn.quant_linear import QuantLinear

    try:
        adapter = get_adapter(model)
    except UnsupportedArchitectureError:
        return {}
    out = {}
    for i, layer in enumerate(adapter.layers(model)):
        if adapter.has_experts(layer) or len(adapter.arch.mlp_in) != 2:
            continue  # experts see their own tokens; a fused gate|up row block (Phi-3) is not two linears
        ins = [get_path(layer, p) for p in adapter.arch.mlp_in]
        down = get_path(layer, adapter.arch.mlp_out)
        t = getattr(down, "input_transform", None)
        if (isinstance(down, QuantLinear) and down.input_perm is not None
                and (t is None or getattr(t, "before_perm", True) is False)  # a transform must say it runs after
                and all(isinstance(m, QuantLinear) and m.out_features == down.in_features for m in ins)):
            out[tuple(f"model.layers.{i}.{p}" for p in adapter.arch.mlp_in)] = f"model.layers.{i}.{adapter.arch.mlp_out}"
    return out
