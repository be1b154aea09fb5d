"""lowbit's batched int8 kernel (W8A8 / W4A4, ``csrc/i8_gemm.c``) at a git revision against the
working tree's, in one process, calls interleaved, the same bits asserted, beside torch's bf16
``F.linear``: how a kernel change is measured without the machine's drift between runs.

    .venv/bin/python scripts/i8_gemm_ab.py --rev c5b3603 [--repeats 11] [--threads 1] [--json OUT]

Shapes: the default model's (576x960 qkv, 576x576 o, 576x3072 gate/up, 1536x576 down), 1 / 16 /
64 / 128 / 512 tokens, bf16 in and out; W4A4 with 64 INT8 outliers and groups of 128.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

SHAPES = [(576, 960), (576, 576), (576, 3072), (1536, 576)]
TOKENS = [1, 16, 64, 128, 512]


def _library_at(rev: str, work: Path):
    from lowbit.kernels.cpu import i8_gemm
    from lowbit.native import cbuild

    csrc = "lowbit/kernels/csrc"
    names = subprocess.run(["git", "ls-tree", "--name-only", f"{rev}:{csrc}"], capture_output=True, text=True,
                           check=True).stdout.split()
    for name in names:
        data = subprocess.run(["git", "show", f"{rev}:{csrc}/{name}"], capture_output=True, check=True).stdout
        (work / name).write_bytes(data)
    lib = cbuild.compile_library(work / "i8_gemm.c", i8_gemm._LIB.flag_sets[0])
    if lib is None:
        raise SystemExit(f"the i8_gemm kernel of {rev} did not build")
    new = i8_gemm.library()  # the one entry point called here has kept its signature
    lib.i8_gemm_linear.argtypes, lib.i8_gemm_linear.restype = new.i8_gemm_linear.argtypes, new.i8_gemm_linear.restype
    return lib


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rev", required=True, help="the git revision to compare with the working tree")
    ap.add_argument("--repeats", type=int, default=11)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    from lowbit.kernels.cpu import i8_gemm, w4a4, w8a8
    from lowbit.kernels.linear_params import from_float

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        libs = {"old": _library_at(args.rev, Path(tmp)), "new": i8_gemm.library()}
    rows = []
    for kind in ("w8a8", "w4a4"):
        total = {"bf16": 0.0, "old": 0.0, "new": 0.0}
        for k, o in SHAPES:
            w = torch.randn(o, k)
            st = (w8a8.prepare(from_float(w, "w8a8"), "gemm") if kind == "w8a8"
                  else w4a4.prepare(from_float(w, "w4a4", n_outliers=64, group=128), "gemm"))
            wb = w.bfloat16()
            for t in TOKENS:
                x = torch.randn(t, k).bfloat16()
                calls = {"bf16": lambda: F.linear(x, wb)}
                for name, lib in libs.items():
                    calls[name] = lambda lib=lib: i8_gemm.linear(x, st.args, o, keep_bf16=True, lib=lib)
                if not torch.equal(calls["old"](), calls["new"]()):
                    raise SystemExit(f"{kind} {k}x{o} at {t} tokens: the two builds disagree")
                times = {name: [] for name in calls}
                for _ in range(args.repeats):
                    for name, fn in calls.items():
                        t0 = time.perf_counter()
                        fn()
                        times[name].append(time.perf_counter() - t0)
                ms = {name: 1e3 * statistics.median(v) for name, v in times.items()}
                for name in total:
                    total[name] += ms[name]
                rows.append({"kind": kind, "shape": f"{k}x{o}", "tokens": t, **{f"{n}_ms": v for n, v in ms.items()}})
                print(f"{kind} {k}x{o} {t:4d} tokens: bf16 {ms['bf16']:.3f}  {args.rev} {ms['old']:.3f}  "
                      f"now {ms['new']:.3f} ms  (now {ms['old'] / ms['new']:.2f}x the old, {ms['bf16'] / ms['new']:.2f}x bf16)")
        print(f"{kind} summed: " + ", ".join(f"{n} {v:.2f} ms" for n, v in total.items()))
    if args.json:
        from lowbit.io.atomic import write_json

        write_json(args.json, {"rev": args.rev, "threads": args.threads, "rows": rows})


if __name__ == "__main__":
    main()
