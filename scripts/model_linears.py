"""One decode or prefill step's linears of the default model (30 layers of q|k|v 576x960, o 576x576,
gate|up 576x3072, down 1536x576), bf16 in and out, through lowbit's prepared kernels as vLLM's
plugin runs them (``PreparedLinear.batched``): torch's bf16 ``F.linear``, W8A8, W4A4 (64 INT8
outliers, groups of 128) without and with an input permutation (the reorder the plugin gives
every W4A4 linear). Random weights of the model's shapes; each step's linears in model order, the
formats interleaved within every repeat, medians. What W4A4 pays over W8A8 on a CPU, where both
multiply int8 codes.

    .venv/bin/python scripts/model_linears.py [--tokens 16,64,256] [--repeats 5] [--threads 2] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

SHAPES = [(576, 960), (576, 576), (576, 3072), (1536, 576)]  # (in, out)
LAYERS = 30


def build() -> dict[str, list]:
    from lowbit.kernels.dispatch import prepare
    from lowbit.kernels.linear_params import from_float

    torch.manual_seed(0)
    calls: dict[str, list] = {"bf16": [], "w8a8": [], "w4a4": [], "w4a4+perm": []}
    for _ in range(LAYERS):
        for n_in, n_out in SHAPES:
            w = torch.randn(n_out, n_in) / n_in ** 0.5
            p4 = from_float(w, "w4a4", group=128, n_outliers=64, act_clip=0.9)
            calls["bf16"].append((n_in, lambda x, w=w.bfloat16(): F.linear(x, w)))
            calls["w8a8"].append((n_in, prepare(from_float(w, "w8a8"), "cpu").batched))
            calls["w4a4"].append((n_in, prepare(p4, "cpu").batched))
            calls["w4a4+perm"].append((n_in, prepare(p4, "cpu", input_perm=torch.randperm(n_in)).batched))
    return calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", default="16,64,256")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    calls = build()
    rows = []
    for t in [int(s) for s in args.tokens.split(",")]:
        xs = {n: torch.randn(t, n).bfloat16() for n in {n for n, _ in SHAPES}}
        times: dict[str, list[float]] = {k: [] for k in calls}
        for _ in range(args.repeats + 1):  # the first round warms up
            for k, fs in calls.items():
                t0 = time.perf_counter()
                for n_in, f in fs:
                    f(xs[n_in])
                times[k].append(time.perf_counter() - t0)
        ms = {k: statistics.median(v[1:]) * 1e3 for k, v in times.items()}
        rows.append({"tokens": t, **{f"{k}_ms": v for k, v in ms.items()}})
        print(f"{t:4d} tokens: " + "  ".join(f"{k} {v:7.2f} ms" for k, v in ms.items())
              + f"   w4a4/w8a8 {ms['w4a4'] / ms['w8a8']:.2f}  perm/no perm {ms['w4a4+perm'] / ms['w4a4']:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"threads": args.threads, "repeats": args.repeats, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
