"""The A16 batched kernel (``csrc/a16_gemm.c``) at a git revision against the working tree's, beside
the 4-bit / 8-bit GEMVs, at small batches (decode), in one process, the same bits asserted. Before
every call a 64 MB buffer is written, so each call reads its weights from memory as a decode step's
layers do, and the kernels run in a new random order every round: with a fixed order and copies of
the weights rotated instead (this script's first version), a kernel's place in the round moved its
median by up to 25 % between identical builds. Run it with ``LOWBIT_ISA=avx2`` to measure the AVX2
builds on an AVX-512 CPU.

    [LOWBIT_ISA=avx2] .venv/bin/python scripts/a16_small_batch_ab.py --rev REV [--kinds w4a16,w8a16]
        [--shapes 4096x4096,3072x576,576x1536] [--tokens 1,2,4,8,16] [--repeats 121] [--json OUT]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from batched_gemm_ab import _library_at  # noqa: E402
from cold_timing import cold_medians_ms  # noqa: E402


def _pairs(text: str) -> list[tuple[int, int]]:
    return [tuple(int(v) for v in s.split("x")) for s in text.split(",")]


def main() -> None:
    from lowbit.kernels.cpu import a16_gemm, w4_gemv, w8_gemv
    from lowbit.kernels.dispatch import prepare
    from lowbit.kernels.linear_params import from_float

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rev", required=True)
    ap.add_argument("--kinds", default="w4a16,w8a16")
    ap.add_argument("--shapes", default="4096x4096,3072x576,576x1536", help="OUTxIN,...")
    ap.add_argument("--tokens", default="1,2,4,8,16")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=121)
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    res = {}
    with tempfile.TemporaryDirectory() as tmp:
        old, new = _library_at(args.rev, Path(tmp), a16_gemm), a16_gemm.library()
        print("build:", " ".join(a16_gemm._LIB.flags))
        for kind in args.kinds.split(","):
            gemv_mod = w4_gemv if kind == "w4a16" else w8_gemv
            for out, n in _pairs(args.shapes):
                p = from_float(torch.randn(out, n) / 64, kind)
                panels = prepare(p, "cpu", cpu_method="gemm").state
                gemv = prepare(p, "cpu", cpu_method="native").state
                for t in (int(v) for v in args.tokens.split(",")):
                    x = torch.randn(t, n).to(getattr(torch, args.dtype))
                    if not torch.equal(a16_gemm.run(x, panels, old), a16_gemm.run(x, panels, new)):
                        raise SystemExit(f"{kind} {out}x{n} at {t} tokens: {args.rev} and the working tree differ")
                    fns = {"old": lambda: a16_gemm.run(x, panels, old), "new": lambda: a16_gemm.run(x, panels, new),
                           "gemv": lambda: gemv_mod.run(x, gemv)}
                    ms = cold_medians_ms(fns, args.repeats, warmup=1)
                    res[f"{kind} {out}x{n} t={t}"] = ms
                    print(f"{kind} {out}x{n} {t} tokens: {args.rev} {ms['old']:.3f} ms, now {ms['new']:.3f} "
                          f"({ms['old'] / ms['new']:.2f}x), GEMV {ms['gemv']:.3f} ({ms['gemv'] / ms['new']:.2f}x)",
                          flush=True)
    if args.json:
        from lowbit.bench.machine import report
        from lowbit.io.atomic import write_json

        write_json(args.json, {"machine": report(), "rev": args.rev, "build": list(a16_gemm._LIB.flags),
                               "threads": args.threads, "dtype": args.dtype, "repeats": args.repeats, "ms": res})


if __name__ == "__main__":
    main()
