"""Rank functions for the tensor-parallel tests (importable by the forkserver)."""

from __future__ import annotations

import torch

from lowbit.parallel.layers import make_reducer, set_reducer
from lowbit.parallel.shard import load_tp_shard


def forward_cases(rank: int, world: int, cases: list[tuple[str, torch.Tensor]], reducers: list[str]) -> list[torch.Tensor]:
    """Logits of every (checkpoint folder, ids) case with every all-reduce, in that order; each
    shard is loaded once and its reducer switched."""
    out = []
    for path, ids in cases:
        model = load_tp_shard(path, rank, world, make_reducer("plain"))
        for name in reducers:
            set_reducer(model, make_reducer(name))
            with torch.inference_mode():
                out.append(model(input_ids=ids, use_cache=False).logits.float())
    return out


def channel_forward(rank: int, world: int, path: str, ids: torch.Tensor, runs: list[tuple[str, dict | None]]) -> list:
    """Logits with each (all-reduce, {layer: outlier channels} or None) on one loaded shard."""
    from lowbit.parallel.layers import install_reducers

    model = load_tp_shard(path, rank, world, make_reducer("plain"))
    out = []
    for name, chans in runs:
        install_reducers(model, name, rank, path, channels=chans)
        with torch.inference_mode():
            out.append(model(input_ids=ids, use_cache=False).logits.float())
    return out
