"""The A16 batched kernel (``csrc/a16_gemm.c``) at a git revision against the working tree's, beside
the 4-bit / 8-bit GEMVs, W4A16 and W8A16 on 4096², 1-4 bf16 tokens, 2 threads, in one process: each
kernel's weights rotate over 12 copies, each kernel 4 copies after the previous one, so no call finds
another's weights in the last-level cache; interleaved medians. Run it with ``LOWBIT_ISA=avx2`` to
compare the AVX2 builds on an AVX-512 CPU (what stop 46 did for the whole-panel work items).

    LOWBIT_ISA=avx2 .venv/bin/python scripts/a16_avx2_items_ab.py --rev REV [--repeats 40] [--json OUT]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from batched_gemm_ab import _library_at  # noqa: E402


def main() -> None:
    from lowbit.kernels.cpu import a16_gemm, w4_gemv, w8_gemv
    from lowbit.kernels.dispatch import prepare
    from lowbit.kernels.linear_params import from_float

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rev", required=True)
    ap.add_argument("--repeats", type=int, default=40)
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.set_num_threads(2)
    torch.manual_seed(0)
    ws = [torch.randn(4096, 4096) / 64 for _ in range(12)]
    cyc = lambda xs, o: itertools.cycle(xs[o:] + xs[:o])  # noqa: E731
    res = {}
    with tempfile.TemporaryDirectory() as tmp:
        old, new = _library_at(args.rev, Path(tmp), a16_gemm), a16_gemm.library()
        print("build:", " ".join(a16_gemm._LIB.flags))
        for kind, gemv_mod in (("w4a16", w4_gemv), ("w8a16", w8_gemv)):
            ps = [from_float(w, kind) for w in ws]
            panels = [prepare(p, "cpu", cpu_method="gemm").state for p in ps]
            gemv = [prepare(p, "cpu", cpu_method="native").state for p in ps]
            for t in (1, 2, 4):
                x = torch.randn(t, 4096).bfloat16()
                if not torch.equal(a16_gemm.run(x, panels[0], old), a16_gemm.run(x, panels[0], new)):
                    raise SystemExit(f"{kind} at {t} tokens: {args.rev} and the working tree differ")
                fns = {"old": lambda c=cyc(panels, 0): a16_gemm.run(x, next(c), old),
                       "new": lambda c=cyc(panels, 4): a16_gemm.run(x, next(c), new),
                       "gemv": lambda c=cyc(gemv, 8): gemv_mod.run(x, next(c))}
                ts = {k: [] for k in fns}
                for _ in range(args.repeats + 1):
                    for k, f in fns.items():
                        t0 = time.perf_counter()
                        f()
                        ts[k].append(time.perf_counter() - t0)
                ms = {k: statistics.median(v[1:]) * 1e3 for k, v in ts.items()}
                res[f"{kind} t={t}"] = ms
                print(f"{kind} {t} tokens: {args.rev} {ms['old']:.3f} ms, now {ms['new']:.3f} ({ms['old'] / ms['new']:.2f}x), "
                      f"GEMV {ms['gemv']:.3f}", flush=True)
    if args.json:
        from lowbit.bench.machine import report
        from lowbit.io.atomic import write_json

        write_json(args.json, {"machine": report(), "rev": args.rev, "build": list(a16_gemm._LIB.flags),
                               "threads": 2, "repeats": args.repeats, "ms": res})


if __name__ == "__main__":
    main()
