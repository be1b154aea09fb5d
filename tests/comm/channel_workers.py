"""Rank functions of the outlier-channel / block-Hadamard all-reduce tests (importable by the forkserver)."""

from __future__ import annotations

import torch

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
HIDDEN = 576


def channel_input(rank: int, tokens: int, dtype_name: str, seed: int, hidden: int = HIDDEN) -> torch.Tensor:
    """Residual-stream-like messages: Gaussian, a few channels 30-100x larger (as in SmolLM2), one huge token."""
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    x = torch.randn(tokens, hidden, generator=g)
    x[:, [5, 77, 300, 301]] *= torch.tensor([30.0, -60.0, 100.0, 45.0])
    x[0] *= 20  # a first token far larger than the others
    return x.to(DTYPES[dtype_name])


def channels_for(n: int, hidden: int = HIDDEN) -> torch.Tensor:
    base = [5, 77, 300, 301]
    rest = [c for c in range(7, hidden, 37) if c not in base]
    return torch.tensor((base + rest)[:n])


def channel_cases(rank: int, world: int, cases: list[tuple]) -> dict:
    """Each (spec, dtype, tokens, seed, shot) case through QuickAllReduce; results, paths, check counts."""
    from lowbit.comm.allreduce import QuickAllReduce
    from lowbit.comm.codecs import parse_spec

    out, paths, checks = [], [], []
    for spec, dtype_name, tokens, seed, shot in cases:
        n = parse_spec(spec).outliers
        twoshot_min = 0 if shot == "twoshot" else 1 << 40
        q = QuickAllReduce(codec=spec, min_bytes=0, table={}, twoshot_min_bytes=twoshot_min, hidden=HIDDEN,
                           outliers=channels_for(n) if n else None)
        for _ in range(2):
            t = channel_input(rank, tokens, dtype_name, seed)
            q.all_reduce(t)
        paths.append((q.last_path, q.last_shot))
        checks.append(q.checked.checks)
        out.append(t)
    return {"out": out, "paths": paths, "checks": checks}


def per_call_plans(rank: int, world: int) -> dict:
    """One QuickAllReduce, two layers' channel sets given per call; a non-contiguous message."""
    from lowbit.comm.allreduce import QuickAllReduce

    q = QuickAllReduce(codec="int4+o8", min_bytes=0, table={}, twoshot_min_bytes=0, hidden=HIDDEN)
    a, b = q.plan_for(channels_for(8)), q.plan_for(torch.arange(8) * 3)
    xa, xb = channel_input(rank, 6, "bfloat16", 3), channel_input(rank, 6, "bfloat16", 4)
    q.all_reduce(xa, plan=a)
    q.all_reduce(xb, plan=b)
    buf = torch.zeros(6, HIDDEN, 2, dtype=torch.bfloat16)
    buf[..., 0] = channel_input(rank, 6, "bfloat16", 3)
    view = buf[..., 0]
    q.all_reduce(view, plan=a)
    return {"a": xa, "b": xb, "noncontig": view.clone(), "untouched": bool((buf[..., 1] == 0).all()),
            "checks": q.checked.checks}


def bad_jobs(rank: int, world: int, kind: str) -> str:
    """A rank whose channel set differs ("channels"), or a message that is not hidden-size ("shape")."""
    from lowbit.comm.allreduce import QuickAllReduce

    chans = channels_for(16)
    if kind == "channels" and rank == 1:
        chans = chans.clone()
        chans[3] = 400
    q = QuickAllReduce(codec="int4+h+o16", min_bytes=0, table={}, hidden=HIDDEN, outliers=chans)
    x = channel_input(rank, 4, "float32", 1)
    if kind == "shape":
        x = x.reshape(-1, 288)
    try:
        q.all_reduce(x)
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return "no error"


def two_shot_rounds(rank: int, world: int, tokens: int, chunk_bytes: int, depth: int) -> dict:
    """Two-shot under a channel plan in rounds of whole tokens (``chunk_bytes`` small: several rounds
    and a short tail), ``depth`` rounds in flight; int4+h+o8 on bf16, int3+h on float16."""
    from lowbit.comm.allreduce import QuickAllReduce

    out = {}
    for spec, dtype in (("int4+h+o8", "bfloat16"), ("int3+h", "float16")):
        n = 8 if "+o" in spec else 0
        q = QuickAllReduce(codec=spec, min_bytes=0, table={}, twoshot_min_bytes=0, hidden=HIDDEN,
                           outliers=channels_for(n) if n else None, chunk_bytes=chunk_bytes, pipeline_depth=depth)
        t = channel_input(rank, tokens, dtype, 11)
        q.all_reduce(t)
        out[spec] = (t, q.last_shot)
    return out


def dead_peer_channels(rank: int, world: int, shot: str) -> str:
    """The last rank dies before a channel-plan all-reduce (no metadata check: the first collective
    is the path's own); the others must raise AllReduceError, not hang."""
    import os

    from lowbit.comm.allreduce import QuickAllReduce

    q = QuickAllReduce(codec="int4+h+o8", min_bytes=0, table={}, check_metadata=False, hidden=HIDDEN,
                       twoshot_min_bytes=0 if shot == "twoshot" else 1 << 40, outliers=channels_for(8))
    if rank == world - 1:
        os._exit(3)  # dies without a word
    try:
        q.all_reduce(channel_input(rank, 40, "bfloat16", 1))
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return "no error"
