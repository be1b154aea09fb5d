"""Cost model of the three all-reduce paths (plain, one-shot, two-shot), fitted to measurements.

Plain (ring) all-reduce of S bytes on W ranks:   t = a + k·S/B,  k = 2(W-1)/W.
Two-shot quick all-reduce moves the same k·S but compressed by the codec's byte ratio r, pays
two (three with the metadata check) collective latencies, and codec compute: encode of the whole
tensor plus of one segment, decode of the whole tensor twice:
    serial rounds:     t = c·a + k·S/(r·B) + n·(e·(1 + 1/W) + 2·d),   n = S / element_size
    pipelined rounds:  t = c·a + max(k·S/(r·B), n·(e·(1 + 1/W) + 2·d))
(QuickAllReduce overlaps round i's transfer with the codec work of its neighbours, so the slower
of wire and compute sets the pace; the pipeline's fill, one round, is neglected.)
One-shot: one all-gather of every rank's whole encoding (each rank receives (W-1)·S/r), one
encode, W decodes, nothing overlapped:
    t = c·a + (W-1)·S/(r·B) + n·(e + W·d),   c = 1 (+1 with an uncached metadata check)
QuickAllReduce caches the metadata check per job, so a repeated message pays it once: c = 1 for
one-shot and 2 for two-shot on every later call, against 1 for plain.
Every form is linear in S, so crossovers have closed forms. ``lowbit tune allreduce`` times all
three paths and fits a line t = alpha + beta·S to each (:func:`fit_path`), because the collectives'
latencies differ per collective and backend; :func:`policy_window` turns three lines into the
size policy's window.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class LinkFit:
    """Plain all-reduce latency ``alpha_s`` and bus bandwidth ``bus_bytes_per_s`` at a world size."""

    alpha_s: float
    bus_bytes_per_s: float
    world_size: int

    def plain_s(self, nbytes: float) -> float:
        k = 2 * (self.world_size - 1) / self.world_size
        return self.alpha_s + k * nbytes / self.bus_bytes_per_s


@dataclass(frozen=True)
class CodecCost:
    """Seconds per element to encode and to decode (measured on the device that runs the ranks)."""

    encode_s_per_elem: float
    decode_s_per_elem: float


def fit_link(sizes_bytes: list[float], seconds: list[float], world_size: int) -> LinkFit:
    """Least-squares fit of t = a + k·S/B to measured plain all-reduce times."""
    if len(sizes_bytes) < 2 or len(sizes_bytes) != len(seconds):
        raise ValueError("fit_link needs at least two (size, time) pairs")
    n = len(sizes_bytes)
    mx, my = sum(sizes_bytes) / n, sum(seconds) / n
    sxx = sum((x - mx) ** 2 for x in sizes_bytes)
    slope = sum((x - mx) * (y - my) for x, y in zip(sizes_bytes, seconds)) / sxx
    slope = max(slope, 1e-15)
    alpha = max(my - slope * mx, 0.0)
    k = 2 * (world_size - 1) / world_size
    return LinkFit(alpha, k / slope, world_size)


def quick_s(nbytes: float, elem_size: int, ratio: float, link: LinkFit, cost: CodecCost, metadata: bool = True,
            pipelined: bool = True) -> float:
    """Modelled seconds of one quick all-reduce of ``nbytes`` (``pipelined``: wire and codec overlap)."""
    w = link.world_size
    k = 2 * (w - 1) / w
    n = nbytes / elem_size
    compute = n * (cost.encode_s_per_elem * (1 + 1 / w) + 2 * cost.decode_s_per_elem)
    wire = k * nbytes / (ratio * link.bus_bytes_per_s)
    return (3 if metadata else 2) * link.alpha_s + (max(wire, compute) if pipelined else wire + compute)


def crossover_bytes(elem_size: int, ratio: float, link: LinkFit, cost: CodecCost, metadata: bool = True,
                    pipelined: bool = True) -> float:
    """Smallest message (bytes) where the model says quick beats plain; ``inf`` if it never does."""
    a_q = quick_s(0, elem_size, ratio, link, cost, metadata, pipelined)
    b_q = quick_s(1.0, elem_size, ratio, link, cost, metadata, pipelined) - a_q
    a_p = link.plain_s(0)
    b_p = link.plain_s(1.0) - a_p
    if b_q >= b_p:
        return math.inf
    return max((a_q - a_p) / (b_p - b_q), 0.0)


def oneshot_s(nbytes: float, elem_size: int, ratio: float, link: LinkFit, cost: CodecCost,
              metadata: bool = False) -> float:
    """Modelled seconds of one one-shot quantized all-reduce of ``nbytes``."""
    w = link.world_size
    n = nbytes / elem_size
    wire = (w - 1) * nbytes / (ratio * link.bus_bytes_per_s)
    compute = n * (cost.encode_s_per_elem + w * cost.decode_s_per_elem)
    return (2 if metadata else 1) * link.alpha_s + wire + compute


@dataclass(frozen=True)
class PathFit:
    """One path's seconds per call, t = alpha_s + s_per_byte·S (fitted to timed calls)."""

    alpha_s: float
    s_per_byte: float

    def seconds(self, nbytes: float) -> float:
        return self.alpha_s + self.s_per_byte * nbytes


def fit_path(sizes_bytes: list[float], seconds: list[float]) -> PathFit:
    """Least-squares line through (size, time), each point weighted by 1/time² (relative error),
    so the small messages' latency is fitted as well as the large ones' bandwidth."""
    if len(sizes_bytes) < 2 or len(sizes_bytes) != len(seconds) or min(seconds) <= 0:
        raise ValueError("fit_path needs at least two (size, time > 0) pairs")
    w = [1.0 / t**2 for t in seconds]
    sw = sum(w)
    mx = sum(wi * x for wi, x in zip(w, sizes_bytes)) / sw
    my = sum(wi * y for wi, y in zip(w, seconds)) / sw
    sxx = sum(wi * (x - mx) ** 2 for wi, x in zip(w, sizes_bytes))
    if sxx == 0:
        raise ValueError("fit_path needs at least two different sizes")
    slope = max(sum(wi * (x - mx) * (y - my) for wi, x, y in zip(w, sizes_bytes, seconds)) / sxx, 0.0)
    return PathFit(max(my - slope * mx, 0.0), slope)


def model_paths(elem_size: int, ratio: float, link: LinkFit, cost: CodecCost) -> dict[str, PathFit]:
    """The three paths' lines from the analytic model (metadata check cached, two-shot pipelined)."""
    lines = {}
    for name, f in (("plain", lambda s: link.plain_s(s)),
                    ("oneshot", lambda s: oneshot_s(s, elem_size, ratio, link, cost)),
                    ("twoshot", lambda s: quick_s(s, elem_size, ratio, link, cost, metadata=False))):
        a = f(0.0)
        lines[name] = PathFit(a, f(1.0) - a)
    return lines


def best_path(nbytes: float, paths: dict[str, PathFit]) -> str:
    """The path with the least modelled time (ties: plain, then one-shot)."""
    order = [p for p in ("plain", "oneshot", "twoshot") if p in paths]
    return min(order, key=lambda p: (paths[p].seconds(nbytes), order.index(p)))


def policy_window(paths: dict[str, PathFit], no_max: int) -> dict[str, int]:
    """The size policy's numbers from three lines: quantize in [min_bytes, max_bytes], one-shot
    below twoshot_min_bytes. The lines' crossovers cut [0, inf) into intervals with one best
    path each; the window runs from the first quantized interval up to the next plain one."""
    cuts = {0.0}
    names = list(paths)
    for i, p in enumerate(names):
        for q in names[i + 1 :]:
            da, db = paths[p].alpha_s - paths[q].alpha_s, paths[q].s_per_byte - paths[p].s_per_byte
            if db != 0 and da / db > 0:
                cuts.add(da / db)
    edges = sorted(cuts)
    spans = []  # (start, best path) per interval, merged
    for lo, hi in zip(edges, edges[1:] + [math.inf]):
        mid = lo + 1.0 if math.isinf(hi) else (lo + hi) / 2
        best = best_path(mid if not math.isinf(hi) else max(2 * lo, lo + 1.0), paths)
        if not spans or spans[-1][1] != best:
            spans.append((lo, best))
    lo_b, hi_b, two_b = no_max, no_max, no_max
    for k, (start, best) in enumerate(spans):
        if best != "plain" and lo_b == no_max:
            lo_b = int(math.ceil(start))
            later_plain = [st for st, b in spans[k + 1 :] if b == "plain"]
            hi_b = int(later_plain[0]) if later_plain else no_max
        if best == "twoshot" and lo_b != no_max and two_b == no_max and start <= hi_b:
            two_b = int(math.ceil(start))
    return {"min_bytes": lo_b, "max_bytes": hi_b, "twoshot_min_bytes": max(two_b, lo_b) if two_b < no_max else no_max}


def to_dict(obj) -> dict:
    return asdict(obj)


def table_entries(measured: dict, world: int, codecs: list[str], dtypes: dict, max_bytes: int,
                  no_max: int) -> tuple[dict, dict]:
    """The size table's entries and the fitted links from ``tune_measure``'s measurements at one
    world size: per (codec, dtype) the three paths' fitted lines, the window they imply
    (:func:`policy_window`, capped at ``max_bytes``) and the analytic model's crossover for
    comparison. ``dtypes``: name -> torch dtype."""
    import torch

    from .codecs import get_codec
    from .policy import table_key

    entries, links = {}, {}
    for d, dtype in dtypes.items():
        pts = measured["plain"][d]
        sizes = [float(s) for s, _ in pts]
        link = fit_link(sizes, [t for _, t in pts], world)
        links[f"w{world}/{d}"] = {"alpha_s": link.alpha_s, "bus_bytes_per_s": link.bus_bytes_per_s, "points": pts}
        es = torch.tensor([], dtype=dtype).element_size()
        for c in codecs:
            key = f"{c}/{d}"
            enc, dec = measured["codec"][key]
            paths = {"plain": fit_path(sizes, [t for _, t in pts])}
            for p in ("oneshot", "twoshot"):
                paths[p] = fit_path([float(s) for s, _ in measured[p][key]], [t for _, t in measured[p][key]])
            win = policy_window(paths, no_max)
            if win["min_bytes"] > max_bytes:
                win = {"min_bytes": no_max, "max_bytes": no_max, "twoshot_min_bytes": no_max}
            win["max_bytes"] = min(win["max_bytes"], max_bytes)
            cross = crossover_bytes(es, get_codec(c).ratio(dtype), link, CodecCost(enc, dec), metadata=False)
            entries[table_key(c, world, dtype)] = {
                **win, "paths": {p: asdict(f) for p, f in paths.items()},
                "points": {p: measured[p][key] for p in ("oneshot", "twoshot")},
                "encode_s_per_elem": enc, "decode_s_per_elem": dec,
                "alpha_s": link.alpha_s, "bus_bytes_per_s": link.bus_bytes_per_s,
                "model_twoshot_crossover_bytes": None if math.isinf(cross) else cross,
            }
    return entries, links
