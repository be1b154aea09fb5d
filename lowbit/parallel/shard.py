"""Build one rank's shard of a Hugging Face decoder straight from its safetensors checkpoint.

The model skeleton is created on the ``meta`` device (no memory); then each linear layer of each
decoder layer is replaced by a real one holding only this rank's rows (q/k/v, gate, up:
column-parallel) or columns (o, down: row-parallel, outputs all-reduced), read with safetensors
slices so no rank ever materialises a full weight. Embeddings, norms and lm_head are replicated.
Which rows and columns each linear keeps comes from the architecture's description
(:func:`lowbit.models.shard_plan.column_rows`, fused q|k|v and gate|up included). The attention
module itself is unchanged: it reshapes with ``view(..., -1, head_dim)``, so it picks up the
local head counts from the weight shapes; the counts it reads elsewhere are set to the local ones.
A mixture-of-experts layer keeps a slice of every expert (:class:`RowParallelExperts`), OLMo 2's
whole-projection q/k norms their heads' part (:mod:`lowbit.parallel.head_norms`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from lowbit.io.safetensors_reader import CheckpointReader
from lowbit.models.adapters import Adapter
from lowbit.models.architectures import architecture
from lowbit.models.lazy import materialize_rest, meta_model
from lowbit.models.module_paths import get_path, set_path
from lowbit.models.shard_plan import TPPlan, column_rows, make_plan, row_columns
from lowbit.nn.experts import ExpertMLP
from lowbit.parallel.head_norms import shard_whole_qk_norms
from lowbit.parallel.layers import RowParallelExperts, RowParallelLinear, column_linear


def _cast(t: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    return None if t is None else t.to(dtype).contiguous()


def _maybe(reader: CheckpointReader, name: str, fn) -> torch.Tensor | None:
    return fn(name) if name in reader else None


def localize_attention(layer: nn.Module, plan: TPPlan, rank: int) -> None:
    """Give the attention module the head counts of this rank's shard, wherever it reads them at
    run time (its own attributes, or its config: Phi-3 cuts its fused q|k|v output by
    ``config.num_attention_heads``)."""
    a = plan.attn[rank]
    attn = get_path(layer, architecture(plan.model_type).attention_out.rpartition(".")[0])
    attn.num_key_value_groups = a.groups
    for attr, n in (("num_key_value_heads", len(a.kv_heads)), ("num_heads", len(a.q_heads))):
        if hasattr(attn, attr):
            setattr(attn, attr, n)
    if getattr(attn, "config", None) is not None:
        local = copy.copy(attn.config)
        local.num_attention_heads, local.num_key_value_heads = len(a.q_heads), len(a.kv_heads)
        attn.config = local


def _shard_experts(layer: nn.Module, prefix: str, reader: CheckpointReader, plan: TPPlan, rank: int,
                   reduce: Callable, dtype: torch.dtype) -> None:
    """Every expert's rows lo..hi-1 of gate and up, the same columns of down, read from the
    checkpoint's per-expert weights; the router whole."""
    ex = architecture(plan.model_type).experts
    lo, hi = plan.expert_mlp[rank]
    gate, up, down = ex.stored_parts
    with torch.device("meta"):
        mlps = nn.ModuleList(ExpertMLP(1, 1) for _ in range(plan.n_experts))
    for e, m in enumerate(mlps):
        base = f"{prefix}{ex.stored}.{e}."
        w = torch.cat([reader.rows(f"{base}{gate}.weight", lo, hi), reader.rows(f"{base}{up}.weight", lo, hi)])
        m.gate_up_proj = column_linear(_cast(w, dtype), None)
        m.down_proj = column_linear(_cast(reader.cols(f"{base}{down}.weight", lo, hi), dtype), None)
    set_path(layer, ex.parent, RowParallelExperts(mlps, get_path(layer, ex.parent).act_fn, reduce))
    set_path(layer, ex.router, nn.Parameter(_cast(reader.full(prefix + ex.stored_router), dtype), requires_grad=False))


def _shard_layer(layer: nn.Module, prefix: str, reader: CheckpointReader, plan: TPPlan, rank: int,
                 reduce: Callable, dtype: torch.dtype) -> None:
    arch = architecture(plan.model_type)
    moe = Adapter(arch).has_experts(layer)
    experts = f"{arch.experts.experts}." if moe else None  # read by _shard_experts under the checkpoint's names

    def dense(paths: dict) -> dict:
        return {p: v for p, v in paths.items() if experts is None or not p.startswith(experts)}

    for path, ranges in dense(column_rows(plan, rank, moe)).items():
        name = prefix + path
        b = _maybe(reader, name + ".bias", lambda n: reader.row_ranges(n, ranges))
        set_path(layer, path, column_linear(_cast(reader.row_ranges(name + ".weight", ranges), dtype), _cast(b, dtype)))
    for path, (lo, hi) in dense(row_columns(plan, rank, moe)).items():
        name = prefix + path
        local = column_linear(_cast(reader.cols(name + ".weight", lo, hi), dtype), None)
        set_path(layer, path, RowParallelLinear(local, _cast(_maybe(reader, name + ".bias", reader.full), dtype), reduce))
    if moe:
        _shard_experts(layer, prefix, reader, plan, rank, reduce, dtype)
    shard_whole_qk_norms(layer, arch, plan, rank, lambda p, ranges: _cast(reader.row_ranges(prefix + p, ranges), dtype))
    localize_attention(layer, plan, rank)


def load_tp_shard(path: str | Path, rank: int, world: int, reduce: Callable[[torch.Tensor], torch.Tensor],
                  dtype: torch.dtype = torch.float32) -> nn.Module:
    """This rank's shard of the checkpoint folder ``path`` as a ready causal LM (eval mode): a
    float Hugging Face checkpoint, or a lowbit one quantized for ``world`` ranks.

    ``reduce`` sums a tensor over the ranks in place (see :func:`lowbit.parallel.layers.make_reducer`).
    Every rank must call this with the same ``world`` and run the same forwards in lockstep.
    """
    from transformers import AutoConfig

    from lowbit.checkpoint.opener import is_quantized_dir

    if is_quantized_dir(path):
        from lowbit.parallel.shard_quantized import load_tp_quantized_shard

        return load_tp_quantized_shard(path, rank, world, reduce)
    config = AutoConfig.from_pretrained(path)
    plan = make_plan(config, world)
    reader = CheckpointReader(path)
    model = meta_model(config, dtype)
    for i, layer in enumerate(model.base_model.layers):
        _shard_layer(layer, f"model.layers.{i}.", reader, plan, rank, reduce, dtype)
    materialize_rest(model, config, reader, dtype, path)
    model.lowbit_tp_plan = plan
    return model.eval()
