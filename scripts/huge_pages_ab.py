"""Prepared weights in 2 MiB pages against torch's own memory (4 KiB pages), side by side in one
process (``lowbit/kernels/cpu/huge_pages.py``). Two measures, each the same bits first:

* ``linears``: one step's 120 linears of the default model's shapes (random weights, as
  ``scripts/model_linears.py``), prepared twice per kind, the copies' steps interleaved, so each
  step reads its weights cold after the other copy's; ms a step, medians.
* ``decode``: the default model built twice per format (``LOWBIT_HUGE_PAGES=0`` and 1), decoding in
  turn within every repeat (``lowbit.bench.decode_ab``: the same tokens, or no comparison).

    .venv/bin/python scripts/huge_pages_ab.py [--part linears,decode] [--formats w4a16,w4a4,w8a8] \\
        [--batches 1,8] [--repeats 9] [OUT.json]
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

import torch

from lowbit.bench.decode_ab import ab_setup, decode_rates, greedy, save_rows

sys.path.insert(0, str(Path(__file__).parent))
from model_linears import LAYERS, SHAPES  # noqa: E402


def linears(kinds: list[str], tokens: list[int], repeats: int) -> dict:
    from lowbit.kernels.dispatch import prepare
    from lowbit.kernels.linear_params import from_float

    torch.manual_seed(0)
    calls: dict = {(k, v): [] for k in kinds for v in ("pages_4k", "pages_2m")}
    for _ in range(LAYERS):
        for n_in, n_out in SHAPES:
            w = torch.randn(n_out, n_in) / n_in ** 0.5
            for kind in kinds:
                p = from_float(w, kind, group=128, **({"n_outliers": 64} if kind == "w4a4" else {}))
                for v, flag in (("pages_4k", "0"), ("pages_2m", "1")):
                    os.environ["LOWBIT_HUGE_PAGES"] = flag
                    calls[(kind, v)].append((n_in, prepare(p, "cpu").batched))
    rows: dict = {}
    for t in tokens:
        xs = {n: torch.randn(t, n).bfloat16() for n in (576, 1536)}
        for kind in kinds:
            a, b = ([f(xs[n]) for n, f in calls[(kind, v)]] for v in ("pages_4k", "pages_2m"))
            if not all(torch.equal(p, q) for p, q in zip(a, b)):
                raise RuntimeError(f"{kind}: other bits from huge pages")
        times: dict = {k: [] for k in calls}
        order = list(calls)
        for r in range(repeats):
            for k in (order if r % 2 == 0 else order[::-1]):
                t0 = time.perf_counter()
                for n, f in calls[k]:
                    f(xs[n])
                times[k].append((time.perf_counter() - t0) * 1e3)
        for kind in kinds:
            a, b = (statistics.median(times[(kind, v)]) for v in ("pages_4k", "pages_2m"))
            rows.setdefault(kind, {})[t] = {"pages_4k_ms": a, "pages_2m_ms": b, "speedup": a / b,
                                            "raw_ms": {v: times[(kind, v)] for v in ("pages_4k", "pages_2m")}}
            print(f"linears {kind} {t} tokens: 4 KiB {a:.2f} ms, 2 MiB {b:.2f} ms, {a / b:.3f}x", flush=True)
    return rows


def main() -> None:
    def extra(ap):
        ap.add_argument("--batches", default="1,8", help="sequences (decode) and tokens (linears)")
        ap.add_argument("--part", default="linears,decode")

    cli, _, tok, build = ab_setup(__doc__.split("\n\n")[0], "w4a16,w4a4,w8a8", 9, extra)
    from lowbit.bench.decode import _cache_for
    from lowbit.data import calibration_ids
    from lowbit.kernels.cpu import huge_pages

    if huge_pages.thp_mode() not in ("always", "madvise"):
        raise SystemExit(f"transparent huge pages are {huge_pages.thp_mode()} here: nothing to compare")
    batches, formats = [int(v) for v in cli.batches.split(",")], cli.formats.split(",")
    rows: dict = {}
    if "linears" in cli.part:
        rows["linears"] = linears(formats, batches, 2 * cli.repeats + 1)
    if "decode" in cli.part:
        rows["decode"] = {}
        for fmt in formats:
            gens = {}
            for name, flag in (("pages_4k", "0"), ("pages_2m", "1")):
                os.environ["LOWBIT_HUGE_PAGES"] = flag
                model = build(fmt)[0]
                gens[name] = greedy(model, tok, lambda m=model, f=fmt: _cache_for(m, f))
            rows["decode"][fmt] = {}
            for b in batches:
                row = decode_rates(gens, calibration_ids(tok, b, 64, seed=1), cli.repeats)
                rows["decode"][fmt][b] = row
                print("decode", fmt, b, {k: round(v, 3) for k, v in row.items() if k != "raw_tok_s"}, flush=True)
    save_rows(cli, __doc__.split("\n\n")[0], rows)


if __name__ == "__main__":
    main()
