"""The row-parallel layers (a linear, or a mixture of experts, whose partial outputs are summed
across ranks) and the reducers: plain ``dist.all_reduce`` or the quantized ``QuickAllReduce`` with a codec."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

from lowbit.comm.codecs import CODECS, parse_spec
from lowbit.comm.policy import NO_MAX
from lowbit.nn.experts import UnfusedExperts

ALLREDUCE_CHOICES = ("plain", *CODECS)  # each codec also with +h / +oN options (parse_allreduce)


def parse_allreduce(name: str) -> str:
    """"plain" or a codec spec's canonical name (``int4+h+o16``); ValueError naming the choices."""
    if name == "plain":
        return name
    try:
        return parse_spec(name).name
    except ValueError as e:
        raise ValueError(f"unknown all-reduce {name!r} ({e}); choose plain or a codec "
                         f"({', '.join(CODECS)}) with optional +h, +h32 and +oN") from None


def quick_all_reduce(allreduce: str, hidden: int | None = None, **kw):
    """``QuickAllReduce`` that quantizes *every* message (min_bytes=0, no tuned table): small decode
    messages are compressed too, so a study measures the codec itself. On 2 ranks every message
    takes the one-shot path: each rank sends the same bytes as with two-shot (its whole encoded
    tensor once, instead of half of it twice) and the sum is not quantized a second time
    (LOWBIT_QR_TWOSHOT_MIN_BYTES=0 restores two-shot, e.g. to measure it)."""
    import warnings

    from lowbit.comm.allreduce import QuickAllReduce

    one_shot = dist.is_initialized() and dist.get_world_size() == 2
    kw = {"min_bytes": 0, "max_bytes": NO_MAX, "table": {}} | ({"twoshot_min_bytes": NO_MAX} if one_shot else {}) | kw
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the INT3-at-W>2 advice: the study measures exactly that
        return QuickAllReduce(codec=allreduce, hidden=hidden, **kw)


def make_reducer(allreduce: str, hidden: int | None = None) -> Callable[[torch.Tensor], torch.Tensor]:
    """In-place SUM over the default group: plain ``dist.all_reduce`` or a codec (``+h`` needs
    ``hidden``; ``+oN`` needs per-layer channels: :func:`install_reducers`)."""
    if parse_allreduce(allreduce) == "plain":
        def plain(t: torch.Tensor) -> torch.Tensor:
            dist.all_reduce(t)
            return t
        return plain
    if parse_spec(allreduce).outliers:
        raise ValueError(f"all-reduce {allreduce!r} needs outlier channels per layer; use install_reducers")
    return quick_all_reduce(allreduce, hidden).all_reduce


def install_reducers(model: nn.Module, allreduce: str, rank: int, source: str, per: str = "model",
                     channels: dict[str, torch.Tensor] | None = None, **calib) -> nn.Module:
    """Give a loaded shard's row-parallel layers the all-reduce ``allreduce``; with ``+oN`` each
    layer gets its own N outlier channels (``per="layer"``) or all the same (``"model"``), calibrated
    by rank 0 on the single-process ``source`` model and broadcast (collective), unless
    ``channels`` ({layer name: channels}, the same on every rank) gives them."""
    spec = parse_allreduce(allreduce)
    hidden = model.config.hidden_size
    if spec == "plain" or not parse_spec(spec).outliers:
        return set_reducer(model, make_reducer(spec, hidden))
    from .outlier_channels import row_parallel_names, shared_channels

    names = row_parallel_names(model)
    chans = channels if channels is not None else shared_channels(rank, source, names, parse_spec(spec).outliers, per,
                                                                  **calib)
    qar = quick_all_reduce(spec, hidden)
    mods = dict(model.named_modules())
    for name in names:
        plan = qar.plan_for(chans[name])
        mods[name].reduce = lambda t, plan=plan: qar.all_reduce(t, plan=plan)
    model.lowbit_outlier_channels = {n: c.tolist() for n, c in chans.items()}
    return model


class RowParallelLinear(nn.Module):
    """``y = sum_ranks(local_r(x_r)) + b``: each rank's ``local`` holds some input columns of W (a
    float linear without bias, or its slice of a TP-quantized layer); the bias is added once,
    after the sum."""

    def __init__(self, local: nn.Module, bias: torch.Tensor | None, reduce: Callable[[torch.Tensor], torch.Tensor]):
        super().__init__()
        self.local = local
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        self.reduce = reduce
        self.in_features, self.out_features = local.in_features, local.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.reduce(self.local(x).contiguous())
        return y if self.bias is None else y + self.bias


class RowParallelExperts(UnfusedExperts):
    """Experts that each hold some of their MLP rows (gate|up) and the same input columns of their
    down projection, the router replicated: every rank routes the same tokens to the same experts,
    so its sum over them is a partial sum of the layer's output, summed across ranks once per
    layer (not once per expert: the same sum, one message)."""

    def __init__(self, experts: nn.ModuleList, act_fn, reduce: Callable[[torch.Tensor], torch.Tensor]):
        nn.Module.__init__(self)
        self.num_experts = len(experts)
        self.experts = experts
        self.act_fn = act_fn
        self.reduce = reduce

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
        return self.reduce(super().forward(hidden_states, top_k_index, top_k_weights).contiguous())


REDUCED = (RowParallelLinear, RowParallelExperts)  # the layers whose output is an all-reduce


def column_linear(weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Linear:
    """An ordinary linear layer holding some output rows (column-parallel: no communication)."""
    lin = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta")
    lin.weight = nn.Parameter(weight, requires_grad=False)
    if bias is not None:
        lin.bias = nn.Parameter(bias, requires_grad=False)
    return lin


def set_reducer(model: nn.Module, reduce: Callable[[torch.Tensor], torch.Tensor]) -> nn.Module:
    """Switch every row-parallel layer of a loaded shard to another all-reduce (no reloading)."""
    for mod in model.modules():
        if isinstance(mod, REDUCED):
            mod.reduce = reduce
    return model
