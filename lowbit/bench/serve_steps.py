"""A vLLM server's engine steps during one concurrency level, split into lowbit's linears and the
rest: where the rest dominates, no linear kernel can make serving faster.

Steps come from vLLM's own Prometheus counters (``/metrics``: ``vllm:iteration_tokens_total``
counts one observation per engine step, its sum the tokens computed), for every format. The
linears' time comes from lowbit's op timing itself in the engine process
(:mod:`lowbit.kernels.op_stats`, ``LOWBIT_OP_STATS``), so only plugin formats have it; vLLM's own
kernels run inside its compiled graph where nothing can time them apart, so their rows say ``-``.
One engine process (the plugin serves tensor_parallel_size=1; with several, each would write the
same file). ms per step is the level's wall time over its steps (idle moments between requests included: at
concurrency 1 an upper bound, from 4 on the engine is hardly ever idle).
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

ITERATIONS = "vllm:iteration_tokens_total"
FLUSH_WAIT_S = 0.6  # longer than op_stats.INTERVAL_S: the engine's last totals reach the file


def parse_iterations(text: str) -> tuple[float, float]:
    """(engine steps, tokens computed) summed over engines from Prometheus text exposition."""
    steps = tokens = 0.0
    for line in text.splitlines():
        if line.startswith(ITERATIONS + "_count"):
            steps += float(line.rsplit(" ", 1)[1])
        elif line.startswith(ITERATIONS + "_sum"):
            tokens += float(line.rsplit(" ", 1)[1])
    return steps, tokens


def read_ops(path: Path | None) -> dict | None:
    if path is None or not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


class StepCounter:
    """``before()`` then ``after(wall_s)`` around one level → the step split of that level."""

    def __init__(self, metrics_url: str, ops_path: Path | None) -> None:
        self.url, self.ops_path = metrics_url, ops_path
        self._start: tuple | None = None

    def _now(self) -> tuple:
        try:
            with urllib.request.urlopen(self.url, timeout=30) as r:
                steps = parse_iterations(r.read().decode())
        except OSError:
            steps = None
        return steps, read_ops(self.ops_path)

    def before(self) -> None:
        time.sleep(FLUSH_WAIT_S)
        self._start = self._now()

    def after(self, wall_s: float) -> dict:
        time.sleep(FLUSH_WAIT_S)
        (s0, o0), (s1, o1) = self._start, self._now()
        return split(s0, s1, o0, o1, wall_s)


def split(s0, s1, o0, o1, wall_s: float) -> dict:
    """The level's steps, tokens per step, ms per step and its linears / rest parts (None where
    unknown)."""
    out = {"steps": None, "tokens_per_step": None, "step_ms": None, "linear_ms": None, "rest_ms": None,
           "linear_share": None}
    if s0 is None or s1 is None or s1[0] <= s0[0]:
        return out
    steps = s1[0] - s0[0]
    out |= {"steps": int(steps), "tokens_per_step": (s1[1] - s0[1]) / steps, "step_ms": 1e3 * wall_s / steps}
    if o0 is not None and o1 is not None and o1.get("pid") == o0.get("pid"):
        lin = o1["seconds"] - o0["seconds"]
        out |= {"linear_ms": 1e3 * lin / steps, "rest_ms": out["step_ms"] - 1e3 * lin / steps,
                "linear_share": lin / wall_s if wall_s > 0 else None}
        out["linear_by_tokens"] = by_tokens(o0.get("by_tokens", {}), o1.get("by_tokens", {}))
    return out


def by_tokens(before: dict, after: dict) -> dict:
    """The level's linear calls by their token count (:data:`lowbit.kernels.op_stats.TOKEN_RANGES`):
    per range the calls, tokens and µs a call, to hold each range against the kernels alone."""
    rows = {}
    for name, (s1, c1, t1) in after.items():
        s0, c0, t0 = before.get(name, (0.0, 0, 0))
        if c1 > c0:
            rows[name] = {"calls": c1 - c0, "tokens": t1 - t0, "us_per_call": 1e6 * (s1 - s0) / (c1 - c0)}
    return rows
