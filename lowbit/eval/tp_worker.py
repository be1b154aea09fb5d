"""What each rank runs: load its shard and do forwards in lockstep with the other ranks.

These functions take ``(rank, world, ...)`` first so :func:`lowbit.parallel.launch.run_ranks` (local
gloo ranks) or torchrun can call them; every rank computes the same logits (embedding and head
are replicated, and both reducers leave every rank with identical sums)."""

from __future__ import annotations

from pathlib import Path

import torch

from lowbit.parallel.layers import install_reducers, make_reducer
from lowbit.parallel.shard import load_tp_shard


def checkpoint_folder(model: str) -> str:
    """The safetensors folder of a model name ("default", a folder, a cached HF id): a float
    checkpoint, or a lowbit one quantized for tensor parallelism (``lowbit quantize --tp W``)."""
    from lowbit.models.loading import resolve

    path = resolve(model)
    if not Path(path).is_dir():
        raise FileNotFoundError(f"tensor parallelism needs a local checkpoint folder; {model!r} resolves to {path}")
    return path


def check_quantized_world(path: str, world: int) -> None:
    """For a lowbit checkpoint: the rank count it was quantized for must be ``world``."""
    from lowbit.checkpoint.opener import is_quantized_dir, read_meta

    from lowbit.parallel.shard_quantized import require_world

    if is_quantized_dir(path):
        require_world(path, read_meta(path)["scheme"].get("tensor_parallel", {}).get("world", 1), world)


def forward_rank(rank: int, world: int, path: str, allreduce: str, ids: torch.Tensor,
                 outlier_channels: str = "model") -> torch.Tensor:
    """Logits ``[B, T, V]`` (fp32) of ``ids`` from the sharded model (the same on every rank)."""
    model = install_reducers(load_tp_shard(path, rank, world, make_reducer("plain")), allreduce, rank, path,
                             outlier_channels)
    with torch.inference_mode():
        return model(input_ids=ids, use_cache=False).logits.float()


def eval_rank(rank: int, world: int, kind: str, model: str, allreduce: str, dataset: str, seqlen: int,
              max_windows: int | None, batch_size: int, ref: str | None, outlier_channels: str = "model") -> dict | None:
    """Perplexity or KL of the sharded model; the result on rank 0, None elsewhere.

    For KL, rank 0 also holds the single-process reference model and runs ``kl_divergence``;
    the other ranks run ``perplexity`` over the same windows. Both do exactly one forward of the
    sharded model per batch of windows, in the same order, so their collectives line up (the
    quick all-reduce's metadata check turns any mismatch into an error, never a silent sum).
    """
    from lowbit.eval.kl import kl_divergence
    from lowbit.eval.perplexity import perplexity
    from lowbit.checkpoint import load_model
    from lowbit.models.loading import load_tokenizer

    path = checkpoint_folder(model)
    tok = load_tokenizer(path)
    tp_model = install_reducers(load_tp_shard(path, rank, world, make_reducer("plain")), allreduce, rank, model,
                                outlier_channels)
    kw = dict(dataset=dataset, seqlen=seqlen, max_windows=max_windows, batch_size=batch_size)
    if kind == "kl" and rank == 0:
        ref_model, _ = load_model(ref or model, kernel="reference")  # as the shards run: KL is the split alone
        res = kl_divergence(ref_model, tp_model, tok, progress=True, **kw).to_dict()
    else:
        res = perplexity(tp_model, tok, progress=rank == 0, **kw).to_dict()
    if rank != 0:
        return None
    res.update(kind=kind, model=model, tp=world, allreduce=allreduce, plan=tp_model.lowbit_tp_plan.describe())
    if hasattr(tp_model, "lowbit_outlier_channels"):
        res.update(outlier_channels=outlier_channels, channels=tp_model.lowbit_outlier_channels)
    return res
