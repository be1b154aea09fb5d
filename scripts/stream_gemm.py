"""One kernel build's time per call when every call streams its weight from memory (as decoding a
model larger than the last-level cache does): each call takes the next of ``--copies`` prepared
copies of a random weight, ``--rounds`` passes over all of them, median per call.

    .venv/bin/python scripts/stream_gemm.py --kinds w4a16,w4a4,w8a8 --tokens 1,4 [--copies 80] [--threads 2]

One build per process: to compare two revisions, run it in each (alternating, twice or more); a
second library's thread pool in the same process changes what is measured (scripts/batched_gemm_ab.py
measures warm weights, one process). ``LOWBIT_ISA`` picks the variant as usual.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kinds", default="w4a16,w4a4,w8a8")
    ap.add_argument("--shape", default="4096x4096", help="IN x OUT")
    ap.add_argument("--tokens", default="1,4")
    ap.add_argument("--copies", type=int, default=80, help="weight copies (80 x 9 MB of W4A16 exceed a 480 MB L3)")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true", help="one JSON line per row instead of text")
    args = ap.parse_args()
    from lowbit.kernels import from_float, prepare
    from lowbit.native.isa import selected

    torch.set_num_threads(args.threads)
    n_in, n_out = (int(v) for v in args.shape.split("x"))
    torch.manual_seed(0)
    w = torch.randn(n_out, n_in) / n_in ** 0.5
    for kind in args.kinds.split(","):
        p = from_float(w, kind, group=128, n_outliers=128 if kind == "w4a4" else 0, act_clip=0.9)
        copies = [prepare(p, "cpu") for _ in range(args.copies)]
        for t in (int(v) for v in args.tokens.split(",")):
            x = torch.randn(t, n_in).to(torch.bfloat16 if kind in ("w4a16", "w8a16") else torch.float32)
            for c in copies:  # warm-up: every copy built and called once
                c(x)
            per_call = []
            for _ in range(args.rounds):
                t0 = time.perf_counter()
                for c in copies:
                    c(x)
                per_call.append((time.perf_counter() - t0) / len(copies))
            ms = 1e3 * statistics.median(per_call)
            row = {"kind": kind, "shape": args.shape, "tokens": t, "copies": args.copies, "threads": args.threads,
                   "isa": selected().name, "median_ms": ms}
            print(json.dumps(row) if args.json else f"{kind} {args.shape} {t:4d} tokens, {args.copies} copies, "
                  f"{args.threads} threads, {row['isa']}: {ms:.3f} ms per call", flush=True)


if __name__ == "__main__":
    main()
