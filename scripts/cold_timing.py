"""Medians of calls that each read their weights from memory, as a decode step's layers do: a 64 MB
buffer is written before every call, and the calls run in a new random order every round (with a
fixed order, a call's place in the round moved its median by up to 25 % between identical builds).
Shared by the small-batch kernel A/B scripts."""

from __future__ import annotations

import random
import statistics
import time

import torch

_FLUSH: list[torch.Tensor] = []


def cold_medians_ms(fns: dict, repeats: int, warmup: int = 0) -> dict[str, float]:
    """``{name: median ms}`` of ``fns`` (name -> call), ``repeats`` timed rounds after ``warmup``."""
    if not _FLUSH:
        _FLUSH.append(torch.zeros(16 << 20))  # 64 MB: beyond the last-level cache
    flush = _FLUSH[0]
    ts = {k: [] for k in fns}
    for r in range(warmup + repeats):
        order = list(fns.items())
        random.shuffle(order)
        for k, f in order:
            flush.add_(1.0)
            t0 = time.perf_counter()
            f()
            if r >= warmup:
                ts[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) * 1e3 for k, v in ts.items()}
