"""The codec x TP accuracy study: perplexity and KL (against the single-process float model) of a
model split over W ranks, for each all-reduce; a rich table and an atomically written JSON.

Run: ``python -m lowbit.comm.tp.study --tp 2 4 --seqlen 512 --max-windows 10 --out tp_study.json``
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from .eval import run_tp_eval
from lowbit.io.atomic import write_text

from .layers import ALLREDUCE_CHOICES


def write_json(path: Path, data) -> None:
    write_text(path, json.dumps(data, indent=2))


def main(argv: list[str] | None = None) -> list[dict]:
    from rich.console import Console
    from rich.table import Table

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--tp", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--allreduce", nargs="+", default=list(ALLREDUCE_CHOICES), choices=ALLREDUCE_CHOICES)
    ap.add_argument("--seqlen", type=int, default=512)
    ap.add_argument("--max-windows", type=int, default=10)
    ap.add_argument("--out", type=Path, default=Path("tp_study.json"))
    a = ap.parse_args(argv)
    rows = []
    for tp in a.tp:
        for ar in a.allreduce:
            t0 = time.perf_counter()
            r = run_tp_eval("kl", a.model, tp, ar, seqlen=a.seqlen, max_windows=a.max_windows)
            r["wall_s"] = time.perf_counter() - t0
            rows.append(r)
            print(json.dumps({k: r[k] for k in ("tp", "allreduce", "ppl", "ref_ppl", "mean_kl", "top1_agreement", "wall_s")}), flush=True)
            write_json(a.out, rows)
    table = Table(title=f"TP all-reduce study: {a.model}, wikitext2, {a.max_windows} x {a.seqlen} tokens")
    for col in ("TP", "all-reduce", "ppl", "single ppl", "ppl rel. diff", "mean KL", "top-1 agree"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(str(r["tp"]), r["allreduce"], f"{r['ppl']:.4f}", f"{r['ref_ppl']:.4f}",
                      f"{(r['ppl'] - r['ref_ppl']) / r['ref_ppl']:+.2e}", f"{r['mean_kl']:.2e}", f"{r['top1_agreement']:.4f}")
    Console().print(table)
    return rows


if __name__ == "__main__":
    main()
