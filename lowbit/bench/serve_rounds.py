"""``lowbit bench serve --rounds N``: every format's vLLM server up at once, each concurrency level
driven N times with the formats in turn, in an order that rotates every round. Run one after
another, servers minutes apart meet a machine whose speed drifts (two runs on one VM disagreed by
more than the formats did); taken in turn within each level, the drift moves every format alike.
Each level's point is its median round (by output tok/s), with every round's rate beside it."""

from __future__ import annotations

from typing import Callable


# what each round keeps beside the median round's whole point, so that formats can be paired round by
# round (the median rounds of two formats may be different rounds of a drifting machine)
ROUND_FIELDS = ("output_tok_s", "step_ms", "linear_ms", "linear_by_tokens")


def median_round(points: list[dict]) -> dict:
    """The round whose output tok/s is the median (the lower middle of an even count), with every
    round's rate, step time, linears' time and linears by token range in ``rounds_<field>`` lists
    in the order they ran (None where a round has no such field)."""
    ranked = sorted(points, key=lambda p: p["output_tok_s"])
    return {**ranked[(len(ranked) - 1) // 2], **{f"rounds_{f}": [p.get(f) for p in points] for f in ROUND_FIELDS}}


def rotated(names: list[str], r: int) -> list[str]:
    k = r % len(names) if names else 0
    return names[k:] + names[:k]


def interleaved_points(servers: dict, levels: list[int], rounds: int, on_failure: Callable[[str, Exception], None],
                       on_point: Callable[[str, int, dict], None] | None = None) -> dict[str, list[dict]]:
    """``servers``: name -> a started server with ``level(c) -> point``. A server whose level fails
    is reported to ``on_failure`` once and left out of the later levels; the others go on.
    ``on_point(name, round, point)`` sees every round's point as it comes (progress)."""
    from .serve_server import ServerFailed

    live = list(servers)
    points: dict[str, list[dict]] = {n: [] for n in servers}
    for c in levels:
        got: dict[str, list[dict]] = {n: [] for n in live}
        for r in range(rounds):
            for name in rotated(live, r):
                if name not in got:  # failed earlier in this level
                    continue
                try:
                    got[name].append(servers[name].level(c))
                    if on_point is not None:
                        on_point(name, r, got[name][-1])
                except ServerFailed as e:
                    on_failure(name, e)
                    del got[name]
        live = [n for n in live if n in got]
        for name in live:
            points[name].append(median_round(got[name]))
    return points
