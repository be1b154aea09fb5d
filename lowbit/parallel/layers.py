"""The row-parallel linear layer (its partial outputs summed across ranks) and the reducers:
plain ``dist.all_reduce`` or the quantized ``QuickAllReduce`` with a codec."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

from lowbit.comm.codecs import CODECS
from lowbit.comm.policy import NO_MAX

ALLREDUCE_CHOICES = ("plain", *CODECS)


def make_reducer(allreduce: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """In-place SUM over the default group. Codecs quantize *every* message (min_bytes=0, no
    tuned table): small decode messages are compressed too, so a study measures the codec itself."""
    if allreduce == "plain":
        def plain(t: torch.Tensor) -> torch.Tensor:
            dist.all_reduce(t)
            return t
        return plain
    if allreduce not in CODECS:
        raise ValueError(f"unknown all-reduce {allreduce!r}; choose from {', '.join(ALLREDUCE_CHOICES)}")
    import warnings

    from lowbit.comm.allreduce import QuickAllReduce

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the INT3-at-W>2 advice: the study measures exactly that
        qar = QuickAllReduce(codec=allreduce, min_bytes=0, max_bytes=NO_MAX, table={})
    return qar.all_reduce


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
        if isinstance(mod, RowParallelLinear):
            mod.reduce = reduce
    return model
