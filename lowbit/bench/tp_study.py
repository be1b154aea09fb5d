"""The codec x TP accuracy study: perplexity and KL (against a single-process reference model) of
a model split over W ranks, for each all-reduce; a rich table and an atomically written JSON.

Float: ``python -m lowbit.bench.tp_study --tp 2 4 --seqlen 512 --max-windows 10 --out tp_study.json``.
Quantized: one checkpoint per rank count (``lowbit quantize --tp W --out q-tp2`` ...), named with a
``{tp}`` placeholder, KL against the float model, plus the checkpoint's single-process row:
``python -m lowbit.bench.tp_study --model q-tp{tp} --ref default --single ...``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from lowbit.comm.codecs import parse_spec
from lowbit.io.atomic import write_json

from lowbit.eval.tp import run_tp_eval
from lowbit.parallel.layers import ALLREDUCE_CHOICES, parse_allreduce

SINGLE = "none (1 process)"


def single_process_row(model: str, ref: str | None, seqlen: int, max_windows: int) -> dict:
    """The same checkpoint in one process: what quantization alone costs, before any codec."""
    from lowbit.eval.kl import kl_divergence
    from lowbit.checkpoint import load_model

    m, tok = load_model(model, kernel="reference")  # as the TP shards run it
    ref_model, _ = load_model(ref or model, kernel="reference")
    r = kl_divergence(ref_model, m, tok, seqlen=seqlen, max_windows=max_windows, progress=True).to_dict()
    r.update(kind="kl", model=model, allreduce=SINGLE)
    return r


def main(argv: list[str] | None = None) -> list[dict]:
    from rich.console import Console
    from rich.table import Table

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default", help="model or checkpoint; '{tp}' in it is replaced by each --tp value")
    ap.add_argument("--ref", help="KL reference, run in one process (default: the model itself)")
    ap.add_argument("--single", action="store_true", help="also evaluate each checkpoint in one process")
    ap.add_argument("--tp", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--allreduce", nargs="+", default=list(ALLREDUCE_CHOICES), type=parse_allreduce,
                    help="plain or codecs, with +h / +oN options (int4+h+o16)")
    ap.add_argument("--outlier-channels", nargs="+", default=["model"], choices=["layer", "model"],
                    help="with +oN codecs: per-layer channel sets, one set for the model, or both (each a row)")
    ap.add_argument("--seqlen", type=int, default=512)
    ap.add_argument("--max-windows", type=int, default=10)
    ap.add_argument("--out", type=Path, default=Path("tp_study.json"))
    a = ap.parse_args(argv)
    rows = []
    for tp in a.tp:
        model = a.model.replace("{tp}", str(tp))
        runs = [(SINGLE, "")] if a.single else []
        for ar in a.allreduce:
            per = a.outlier_channels if ar != "plain" and parse_spec(ar).outliers else [""]
            runs += [(ar, p) for p in per]
        for ar, per in runs:
            t0 = time.perf_counter()
            if ar == SINGLE:
                r = single_process_row(model, a.ref, a.seqlen, a.max_windows)
            else:
                r = run_tp_eval("kl", model, tp, ar, seqlen=a.seqlen, max_windows=a.max_windows, ref=a.ref,
                                outlier_channels=per or "model")
                if per:
                    r["allreduce"] = f"{ar} ({per})"
            r.update(tp=tp, wall_s=time.perf_counter() - t0)
            rows.append(r)
            print(json.dumps({k: r[k] for k in ("tp", "allreduce", "ppl", "ref_ppl", "mean_kl", "top1_agreement", "wall_s")}), flush=True)
            write_json(a.out, rows)
    table = Table(title=f"TP all-reduce study: {a.model}, wikitext2, {a.max_windows} x {a.seqlen} tokens")
    for col in ("TP", "all-reduce", "ppl", "ref ppl", "ppl / ref", "mean KL", "top-1 agree"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(str(r["tp"]), r["allreduce"], f"{r['ppl']:.4f}", f"{r['ref_ppl']:.4f}",
                      f"{r['ppl'] / r['ref_ppl']:.4f}", f"{r['mean_kl']:.2e}", f"{r['top1_agreement']:.4f}")
    Console().print(table)
    return rows


if __name__ == "__main__":
    main()
