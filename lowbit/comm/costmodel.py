"""Cost model of plain vs quantized all-reduce, fitted to measurements.

Plain (ring) all-reduce of S bytes on W ranks:   t = a + k·S/B,  k = 2(W-1)/W.
Two-shot quick all-reduce moves the same k·S but compressed by the codec's byte ratio r, pays
two (three with the metadata check) collective latencies, and codec compute: encode of the whole
tensor plus of one segment, decode of the whole tensor twice:
    serial rounds:     t = c·a + k·S/(r·B) + n·(e·(1 + 1/W) + 2·d),   n = S / element_size
    pipelined rounds:  t = c·a + max(k·S/(r·B), n·(e·(1 + 1/W) + 2·d))
(QuickAllReduce overlaps round i's transfer with the codec work of its neighbours, so the slower
of wire and compute sets the pace; the pipeline's fill, one round, is neglected.) Every form is
linear in S, so the crossover (the minimum size where quick wins) has a closed form.
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


def to_dict(obj) -> dict:
    return asdict(obj)
