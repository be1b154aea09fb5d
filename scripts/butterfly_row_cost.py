"""What the block Hadamard (``+h``, 64 values) adds to each step of the all-reduce codecs' C paths,
per 2048-value row: each step timed with the block and without it, interleaved, on a message that
stays in cache (64 rows, hidden 2048, bf16), medians; the difference is the butterfly's cost there.

    .venv/bin/python scripts/butterfly_row_cost.py [--rows 64] [--repeats 301] [--json OUT]

Steps: ``split`` (bf16 -> float32 rest: the float32 butterfly), ``encode`` (the fused INT4 encode;
without the block it takes the plain codec's bf16 row step), ``merge`` (float32 rest -> bf16: the
inverse float32 butterfly) and ``decode-merge`` (one INT4 wire -> bf16; with the block the integer
stages of AVX-512 builds). One thread; the build this CPU selects (``lowbit env`` names it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch


def main() -> int:
    from lowbit.comm.codecs import get_codec, native

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=301)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    if not native.available():
        raise SystemExit("the codecs' C library does not build here")
    torch.set_num_threads(1)
    hidden, c = 2048, get_codec("int4")
    x = torch.randn(a.rows, hidden).bfloat16()
    none, h = torch.empty(0, dtype=torch.int64), 0.125
    rest = torch.empty(a.rows, hidden)
    outl = torch.empty(a.rows, 0, dtype=x.dtype)
    out = torch.empty_like(x)
    wires = {b: torch.empty(a.rows, c.row_bytes, dtype=torch.uint8) for b in (0, 64)}
    for b in (0, 64):
        native.encode_split(x, hidden, none, 0, b, h, 0, 4, c.row_bytes, c.code_bytes, wires[b], outl)
    steps = {
        "split": lambda b: native.split_channels(x, hidden, none, 0, b, h, rest, outl),
        "encode": lambda b: native.encode_split(x, hidden, none, 0, b, h, 0, 4, c.row_bytes, c.code_bytes, wires[b], outl),
        "merge": lambda b: native.merge_channels(rest, hidden, none, 0, b, h, None, out),
        "decode-merge": lambda b: native.decode_merge_channels([wires[b]], 0, 4, c.row_bytes, c.code_bytes, hidden, none,
                                                              0, b, h, None, out),
    }
    times = {(s, b): [] for s in steps for b in (0, 64)}
    for rep in range(a.repeats):
        for s, fn in steps.items():
            for b in ((0, 64) if rep % 2 else (64, 0)):
                t = time.perf_counter()
                fn(b)
                times[(s, b)].append(time.perf_counter() - t)
    rows = []
    for s in steps:
        plain, hadamard = (statistics.median(times[(s, b)]) / a.rows * 1e9 for b in (0, 64))
        rows.append({"step": s, "ns_per_row_without": plain, "ns_per_row_with": hadamard, "butterfly_ns": hadamard - plain})
        print(f"{s:13s} {plain:7.0f} ns a row without the block Hadamard, {hadamard:7.0f} with: +{hadamard - plain:.0f} ns")
    if a.json:
        a.json.write_text(json.dumps({"meta": vars(a) | {"json": str(a.json)}, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
