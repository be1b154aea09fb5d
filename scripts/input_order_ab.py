"""W4A4's input reorder planned once per layer (``i8_gemm.InputOrder``, as ``prepare`` builds it)
against the same reorder checked and planned in every call (int64 indices, as before), in one
process and one build, the same bits asserted. ``linears``: the default model's four shapes with an
outlier order as lowbit's quantizer makes one, beside no reorder, medians of ``--repeats`` of 20
calls each, interleaved. ``decode``: lowbit's own W4A4 decode as ``lowbit bench decode`` builds it
(:mod:`lowbit.bench.decode_ab`), every planned order swapped for its indices in the second variant.

    .venv/bin/python scripts/input_order_ab.py linears [--tokens 1,4,16,64,256] [--repeats 21] [--json OUT]
    .venv/bin/python scripts/input_order_ab.py decode [--repeats 7] [OUT.json]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

import torch

from lowbit.kernels.cpu import i8_gemm

sys.path.insert(0, str(Path(__file__).parent))
from model_linears import SHAPES, outlier_order  # noqa: E402


def linears(argv: list[str]) -> None:
    from lowbit.bench.machine import report
    from lowbit.io.atomic import write_json
    from lowbit.kernels.cpu import w4a4
    from lowbit.kernels.linear_params import from_float

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", default="1,4,16,64,256")
    ap.add_argument("--repeats", type=int, default=21)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json")
    cli = ap.parse_args(argv)
    torch.set_num_threads(cli.threads)
    torch.manual_seed(0)
    tokens = [int(t) for t in cli.tokens.split(",")]
    rows, total = [], {}
    for n_in, n_out in SHAPES:
        w = torch.randn(n_out, n_in) / n_in ** 0.5
        st = w4a4.prepare(from_float(w, "w4a4", group=128, n_outliers=64, act_clip=0.9), "gemm")
        perm = outlier_order(n_in)
        order = i8_gemm.InputOrder(perm)
        calls = {name: (lambda x, given=given: i8_gemm.linear(x, st.args, n_out, given, keep_bf16=True))
                 for name, given in (("no_reorder", None), ("per_call", perm), ("planned", order))}
        for t in tokens:
            x = torch.randn(t, n_in).bfloat16()
            if not torch.equal(calls["per_call"](x), calls["planned"](x)):
                raise RuntimeError(f"{n_in}x{n_out} at {t} tokens: the planned order gives other bits")
            us = {name: [] for name in calls}
            for r in range(cli.repeats):
                for name in (list(calls) if r % 2 == 0 else list(calls)[::-1]):
                    t0 = time.perf_counter()
                    for _ in range(20):
                        calls[name](x)
                    us[name].append((time.perf_counter() - t0) / 20 * 1e6)
            med = {name: statistics.median(v) for name, v in us.items()}
            rows.append({"shape": f"{n_in}x{n_out}", "tokens": t, **{f"{k}_us": v for k, v in med.items()}})
            for k, v in med.items():
                total[(t, k)] = total.get((t, k), 0.0) + v
    print(f"{'tokens':>6} {'no reorder':>11} {'per call':>9} {'planned':>8}  reorder cost, us    per call / planned")
    summed = []
    for t in tokens:
        n, a, b = (total[(t, k)] for k in ("no_reorder", "per_call", "planned"))
        summed.append({"tokens": t, "no_reorder_us": n, "per_call_us": a, "planned_us": b, "ratio": a / b})
        print(f"{t:6d} {n:11.1f} {a:9.1f} {b:8.1f}  {a - n:7.1f} -> {b - n:6.1f}     {a / b:.3f}x")
    if cli.json:
        write_json(cli.json, {"machine": report(), "what": __doc__, "repeats": cli.repeats, "threads": cli.threads,
                              "rows": rows, "summed_over_shapes": summed})


def decode() -> None:
    from lowbit.bench.decode_ab import ab_setup, as_is_against, save_rows

    cli, _, tok, build = ab_setup(__doc__, "w4a4", 7)
    real = i8_gemm.linear

    def per_call(x, args, out, perm=None, keep_bf16=False, lib=None):
        return real(x, args, out, perm.perm if isinstance(perm, i8_gemm.InputOrder) else perm, keep_bf16, lib)

    @contextlib.contextmanager
    def planned_per_call():
        i8_gemm.linear = per_call  # linear_in_dtype looks the name up at each call
        try:
            yield
        finally:
            i8_gemm.linear = real

    save_rows(cli, __doc__, as_is_against(cli, tok, build, ("planned_once", "planned_per_call"), planned_per_call))


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    if mode not in ("linears", "decode"):
        sys.exit(f"usage: {sys.argv[0]} linears|decode [options]  (see --help of each)")
    sys.argv = [sys.argv[0]] + sys.argv[2:]
    linears(sys.argv[1:]) if mode == "linears" else decode()
