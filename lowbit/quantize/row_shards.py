"""TP-aware quantization of the row-parallel linears (o_proj, down_proj, every expert's down_proj).

Their input is split across tensor-parallel ranks, so a global outlier permutation or a group of
128 channels would mix channels that live on different ranks. Here each rank's input slice is
quantized as its own linear: outliers picked within the slice (``k`` shared out in proportion to
the slice widths), a permutation inside the slice, groups, GPTQ on the slice's block of XᵀX and
the INT8 outlier scale all local. The result computes ``sum_r part_r(x_r)``, exactly what the
ranks' all-reduce computes, so one checkpoint runs single-process and sharded.
"""

from __future__ import annotations

import torch
from torch import nn

from lowbit.formats.scheme import Scheme
from lowbit.models.module_paths import set_path
from lowbit.nn.quant_linear import QuantLinear
from lowbit.nn.row_sharded import RowShardedLinear

from .outliers import outlier_permutation
from .recipe_steps import RecipeSteps
from .weights import quantize_weights


def tp_splits(model: nn.Module, scheme: Scheme) -> dict[str, list[int]]:
    """Input widths per rank of each row-parallel linear, ``{}`` when quantizing for one rank."""
    world = scheme.tensor_parallel.world
    if world == 1:
        return {}
    from lowbit.models.shard_plan import row_parallel_splits

    # TPSplitError for a model that cannot be split (too few heads or MLP rows, or what its architecture lacks)
    return row_parallel_splits(model.config, world)


def shard_outliers(k: int, n_in: int, width: int) -> int:
    """A slice's share of the ``k`` outlier channels, in proportion to its width."""
    return round(k * width / n_in)


def quantize_row_sharded(layer: nn.Module, path: str, mod: nn.Linear, xtx: torch.Tensor, splits: list[int],
                         scheme: Scheme, steps: RecipeSteps) -> torch.Tensor | None:
    """Replace ``layer.<path>`` by a :class:`RowShardedLinear`; the (block-diagonal) permutation."""
    if not steps.replace_linears:
        return None
    n_in = mod.in_features
    if sum(splits) != n_in:
        raise ValueError(f"{path}: slices {splits} do not cover its {n_in} input channels")
    k = scheme.outliers.k_for(n_in)
    prec = scheme.outliers.precision
    w_all = mod.weight.detach().float()
    parts, perms, lo = [], [], 0
    for width in splits:
        hi = lo + width
        h, w, ks = xtx[lo:hi, lo:hi], w_all[:, lo:hi], shard_outliers(k, n_in, width)
        perm = outlier_permutation(torch.diag(h), ks) if k else None
        if perm is not None:
            w, h = w[:, perm], h[perm][:, perm]
        if steps.quantize_weights:
            qw = quantize_weights([w], [h], scheme, ks, shared_input=False)[0]
            parts.append(QuantLinear.from_quantized(qw, scheme.activations, perm, None, prec))
        else:
            parts.append(QuantLinear.from_float(w, steps.activations, perm, None, ks, prec))
        perms.append(lo + (perm if perm is not None else torch.arange(width, device=w.device)))
        lo = hi
    set_path(layer, path, RowShardedLinear(parts, splits, mod.out_features, mod.bias))
    return torch.cat(perms) if k else None
