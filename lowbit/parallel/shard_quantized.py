"""One rank's shard of a lowbit checkpoint quantized for W tensor-parallel ranks
(``lowbit quantize --tp W``).

Column-parallel q/k/v and gate/up keep whole output rows of the packed codes, group scales and
INT8 outlier weights and scales; their input permutation lives in the (replicated) permuted norm.
The row-parallel o_proj and down_proj (every expert's down_proj) were quantized slice by slice
(:mod:`lowbit.quantize.row_shards`), so rank r loads part r whole: its own permutation, groups and
outlier channels. Only this rank's rows and part are read from the safetensors file.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch
from torch import nn

from lowbit.errors import CheckpointError
from lowbit.checkpoint.load import skeleton
from lowbit.checkpoint.opener import TensorFile, open_folder
from lowbit.models.lazy import materialize_rest
from lowbit.nn.quant_linear import QuantLinear, QuantLinearLayout

from lowbit.models.adapters import Adapter
from lowbit.models.architectures import architecture
from lowbit.models.module_paths import get_path, set_path
from lowbit.models.shard_plan import TPSplitError, column_rows, make_plan, row_columns
from lowbit.parallel.head_norms import shard_whole_qk_norms
from lowbit.parallel.layers import RowParallelExperts, RowParallelLinear, column_linear
from lowbit.parallel.shard import localize_attention

Select = Callable[[str], torch.Tensor]


def _fill(mod: QuantLinear, name: str, read: Callable[[str, str], torch.Tensor]) -> QuantLinear:
    for b, t in mod._buffers.items():
        if t is None:
            continue
        v = read(f"{name}.{b}", b)
        if tuple(v.shape) != tuple(t.shape) or v.dtype != t.dtype:
            raise CheckpointError(f"{name}.{b}: checkpoint has {tuple(v.shape)} {v.dtype}, its layout needs "
                                  f"{tuple(t.shape)} {t.dtype}")
        mod._buffers[b] = v.contiguous()
    return mod


def _column(reader: TensorFile, name: str, layouts: dict, select: Select, n_rows: int) -> nn.Module:
    """Output rows ``select`` of linear ``name``: packed when the checkpoint quantized it."""
    if name in layouts:
        lay = replace(QuantLinearLayout.from_dict(layouts[name]), out_features=n_rows)
        return _fill(QuantLinear(lay), name, lambda full, buf: reader.full(full) if buf == "input_perm" else select(full))
    bias = select(name + ".bias") if name + ".bias" in reader else None
    return column_linear(select(name + ".weight").float().contiguous(), None if bias is None else bias.float())


def _row(reader: TensorFile, name: str, layout: dict, rank: int, lo: int, hi: int) -> tuple[nn.Module, torch.Tensor | None]:
    """Input columns lo..hi-1 of row-parallel linear ``name`` and the bias to add after the sum."""
    sharded = layout.get("row_sharded", {}).get(name)
    bias = reader.full(name + ".bias").float() if name + ".bias" in reader else None
    if sharded is not None:
        if sharded["splits"][rank] != hi - lo:
            raise CheckpointError(f"{name}: slice {rank} of the checkpoint has {sharded['splits'][rank]} channels, "
                                  f"this split gives rank {rank} {hi - lo}")
        part = f"{name}.parts.{rank}"
        local = _fill(QuantLinear(QuantLinearLayout.from_dict(layout["quant_linears"][part])), part,
                      lambda full, buf: reader.full(full))
        return local, bias
    if name in layout.get("quant_linears", {}):  # one rank: the whole layer (its bias inside)
        lay = QuantLinearLayout.from_dict(layout["quant_linears"][name])
        return _fill(QuantLinear(lay), name, lambda full, buf: reader.full(full)), None
    return column_linear(reader.cols(name + ".weight", lo, hi).float().contiguous(), None), bias


def _shard_layer(layer: nn.Module, prefix: str, reader: TensorFile, layout: dict, plan, rank: int,
                 reduce: Callable) -> None:
    qls = layout.get("quant_linears", {})
    arch = architecture(plan.model_type)
    moe = Adapter(arch).has_experts(layer)
    for path, ranges in column_rows(plan, rank, moe).items():
        n_rows = sum(hi - lo for lo, hi in ranges)
        set_path(layer, path, _column(reader, prefix + path, qls, lambda n: reader.row_ranges(n, ranges), n_rows))
    downs = set(arch.experts.downs(plan.n_experts)) if moe else set()
    for path, (lo, hi) in row_columns(plan, rank, moe).items():
        local, bias = _row(reader, prefix + path, layout, rank, lo, hi)
        if path in downs and bias is not None:
            raise CheckpointError(f"{prefix + path} has a bias; lowbit's experts have none")
        set_path(layer, path, local if path in downs else RowParallelLinear(local, bias, reduce))
    if moe:  # every expert's down holds a partial sum: one all-reduce after the experts
        experts = get_path(layer, arch.experts.parent)
        set_path(layer, arch.experts.parent, RowParallelExperts(experts.experts, experts.act_fn, reduce))
    shard_whole_qk_norms(layer, arch, plan, rank, lambda p, ranges: reader.row_ranges(prefix + p, ranges).float())
    localize_attention(layer, plan, rank)


def require_world(path, made_for: int, world: int) -> None:
    """A checkpoint quantized for ``made_for`` ranks runs on exactly that many."""
    if made_for != world:
        raise TPSplitError(f"{path} was quantized for {made_for} tensor-parallel rank(s), not {world}: run it with "
                           f"--tp {made_for}, or quantize again with `lowbit quantize --tp {world}`")


def load_tp_quantized_shard(path: str | Path, rank: int, world: int, reduce: Callable[[torch.Tensor], torch.Tensor]) -> nn.Module:
    """This rank's shard of the lowbit checkpoint ``path`` (see :func:`lowbit.parallel.shard.load_tp_shard`)."""
    from lowbit.nn.kv_cache import install_scheme_kv_cache

    # every rank checks the tensors' full hash (one read of the file): a flipped byte in a rank's
    # slice would otherwise load a wrong model silently
    ck = open_folder(path)
    scheme, config, reader, layout = ck.scheme, ck.config, ck.tensors, ck.layout
    require_world(path, scheme.tensor_parallel.world, world)
    plan = make_plan(config, world)
    model = skeleton(ck)
    for i, layer in enumerate(model.base_model.layers):
        _shard_layer(layer, f"model.layers.{i}.", reader, layout, plan, rank, reduce)
    materialize_rest(model, config, reader, torch.float32, path)
    if scheme.kv_cache.enabled:
        install_scheme_kv_cache(model, scheme.kv_cache)
    model.lowbit_tp_plan, model.lowbit_scheme = plan, scheme
    return model.eval()
