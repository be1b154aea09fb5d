"""Build one rank's shard of a Hugging Face decoder straight from its safetensors checkpoint.

The model skeleton is created on the ``meta`` device (no memory); then each linear layer of each
decoder layer is replaced by a real one holding only this rank's rows (q/k/v, gate, up:
column-parallel) or columns (o, down: row-parallel, outputs all-reduced), read with safetensors
slices so no rank ever materialises a full weight. Embeddings, norms and lm_head are replicated.
The attention module itself is unchanged: it reshapes with ``view(..., -1, head_dim)``, so it
picks up the local head counts from the weight shapes; only ``num_key_value_groups`` is set.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from lowbit.io.safetensors_reader import CheckpointReader
from lowbit.models.lazy import materialize_rest, meta_model

from lowbit.parallel.layers import RowParallelLinear, column_linear
from lowbit.models.shard_plan import TPPlan, make_plan


def _cast(t: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    return None if t is None else t.to(dtype).contiguous()


def _maybe(reader: CheckpointReader, name: str, fn) -> torch.Tensor | None:
    return fn(name) if name in reader else None


def _shard_layer(layer: nn.Module, prefix: str, reader: CheckpointReader, plan: TPPlan, rank: int,
                 reduce: Callable, dtype: torch.dtype) -> None:
    a, hd = plan.attn[rank], plan.head_dim
    q, kv = list(a.q_heads), list(a.kv_heads)
    attn = layer.self_attn
    p = prefix + "self_attn."
    attn.q_proj = column_linear(_cast(reader.row_blocks(p + "q_proj.weight", q, hd), dtype),
                                _cast(_maybe(reader, p + "q_proj.bias", lambda n: reader.row_blocks(n, q, hd)), dtype))
    for name in ("k_proj", "v_proj"):
        w = reader.row_blocks(p + f"{name}.weight", kv, hd)
        b = _maybe(reader, p + f"{name}.bias", lambda n: reader.row_blocks(n, kv, hd))
        setattr(attn, name, column_linear(_cast(w, dtype), _cast(b, dtype)))
    attn.num_key_value_groups = a.groups
    attn.o_proj = RowParallelLinear(column_linear(_cast(reader.cols(p + "o_proj.weight", q[0] * hd, (q[-1] + 1) * hd), dtype), None),
                                    _cast(_maybe(reader, p + "o_proj.bias", reader.full), dtype), reduce)
    mlp = layer.mlp
    p = prefix + "mlp."
    lo, hi = plan.mlp[rank]
    for name in ("gate_proj", "up_proj"):
        b = _maybe(reader, p + f"{name}.bias", lambda n: reader.rows(n, lo, hi))
        setattr(mlp, name, column_linear(_cast(reader.rows(p + f"{name}.weight", lo, hi), dtype), _cast(b, dtype)))
    mlp.down_proj = RowParallelLinear(column_linear(_cast(reader.cols(p + "down_proj.weight", lo, hi), dtype), None),
                                      _cast(_maybe(reader, p + "down_proj.bias", reader.full), dtype), reduce)


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
