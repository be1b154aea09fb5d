"""The INT8-weight GEMV (``csrc/w8_gemv.c``: W8A8's default kernel on CPUs without VNNI, W8A16's
GEMV) at a git revision against the working tree's, in one process, the same bits asserted, each
call reading its weights from memory (``cold_timing.py``). Run it with ``LOWBIT_ISA=avx2`` to
measure the AVX2 build on an AVX-512 CPU.

    [LOWBIT_ISA=avx2] .venv/bin/python scripts/w8_gemv_ab.py --rev REV [--tokens 1,4] [--repeats 41] [--json OUT]

Shapes (OUTxIN): the default model's four (qkv 960x576, o 576x576, gate/up 3072x576, down
576x1536) and 4096x4096; bf16 activations, INT8 per-token codes (W8A8), 2 threads.
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

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536), (4096, 4096)]


def main() -> None:
    from lowbit.kernels.cpu import w8_gemv
    from lowbit.kernels.linear_params import from_float

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rev", required=True)
    ap.add_argument("--tokens", default="1,4")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=41)
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    res = {}
    with tempfile.TemporaryDirectory() as tmp:
        old, new = _library_at(args.rev, Path(tmp), w8_gemv), w8_gemv._LIB.get()
        print("build:", " ".join(w8_gemv._LIB.flags))
        for out, n in SHAPES:
            p = from_float(torch.randn(out, n) / 64, "w8a8")
            w = w8_gemv.prepare(p.codes, p.scale[:, 0])
            for t in (int(v) for v in args.tokens.split(",")):
                x = torch.randn(t, n).bfloat16()
                fns = {b: (lambda lib=lib: w8_gemv.quantize_and_run(x, w, 8, 1.0, lib=lib)) for b, lib in
                       (("old", old), ("new", new))}
                if not torch.equal(fns["old"](), fns["new"]()):
                    raise SystemExit(f"{out}x{n} at {t} tokens: {args.rev} and the working tree differ")
                ms = cold_medians_ms(fns, args.repeats)
                res[f"{out}x{n} t={t}"] = ms
                print(f"{out}x{n} {t} tokens: {args.rev} {ms['old']:.4f} ms, now {ms['new']:.4f} "
                      f"({ms['old'] / ms['new']:.2f}x)", flush=True)
    if args.json:
        from lowbit.bench.machine import report
        from lowbit.io.atomic import write_json

        write_json(args.json, {"machine": report(), "rev": args.rev, "build": list(w8_gemv._LIB.flags),
                               "threads": args.threads, "repeats": args.repeats, "ms": res})


if __name__ == "__main__":
    main()
