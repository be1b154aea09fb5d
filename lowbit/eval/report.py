"""Result files (JSON, written atomically), rich tables, and side-by-side comparison of two runs."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

import torch

FORMAT_VERSION = 1
# Which fields of each kind of result are metrics worth comparing, and the key naming a row.
METRICS = {
    "ppl": ("ppl", "nll"),
    "zeroshot": ("acc", "acc_norm", "ppl"),
    "kl": ("mean_kl", "median_kl", "p99_kl", "top1_agreement", "ppl", "ref_ppl"),
}
LOWER_IS_BETTER = {"ppl", "nll", "mean_kl", "median_kl", "p99_kl", "ref_ppl"}


def row_key(kind: str, result: dict) -> str:
    if kind == "zeroshot":
        return f"{result['task']}"
    return f"{result['dataset']}@{result['seqlen']}"


def make_record(kind: str, model: str, results: list[dict], **info) -> dict:
    return {
        "lowbit_eval": FORMAT_VERSION, "kind": kind, "model": model, "results": results,
        "torch_threads": torch.get_num_threads(), "host": platform.node(),
        "finished_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **info,
    }


def save_json(record: dict, path: str | os.PathLike) -> None:
    """Write ``record`` as JSON atomically (lowbit's one JSON writer)."""
    from lowbit.io.atomic import write_json

    write_json(path, record)


def load_json(path: str | os.PathLike) -> dict:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"result file not found: {path}")
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from e
    if not isinstance(record, dict) or record.get("lowbit_eval") != FORMAT_VERSION or record.get("kind") not in METRICS:
        raise ValueError(f"{path} is not a lowbit eval result (written by 'lowbit eval ... --json')")
    return record


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4f}" if abs(v) < 1000 else f"{v:.1f}"
    return str(v)


def results_table(record: dict):
    from rich.table import Table

    kind = record["kind"]
    cols = {"ppl": ("ppl", "nll", "n_windows", "n_tokens", "seconds"),
            "zeroshot": ("acc", "acc_norm", "acc_stderr", "ppl", "n_items", "seconds"),
            "kl": ("mean_kl", "median_kl", "p99_kl", "top1_agreement", "ppl", "ref_ppl", "n_tokens", "method", "seconds")}[kind]
    table = Table(title=f"lowbit eval {kind}: {record['model']}")
    table.add_column("dataset" if kind != "zeroshot" else "task")
    for c in cols:
        table.add_column(c, justify="right")
    for r in record["results"]:
        table.add_row(row_key(kind, r), *[_fmt(r.get(c)) for c in cols])
    return table


def compare_rows(a: dict, b: dict) -> list[tuple[str, str, float | None, float | None, float | None]]:
    """(row, metric, value in A, value in B, B - A) for every metric either file has."""
    if a["kind"] != b["kind"]:
        raise ValueError(f"cannot compare a {a['kind']} result with a {b['kind']} result")
    kind = a["kind"]
    ra = {row_key(kind, r): r for r in a["results"]}
    rb = {row_key(kind, r): r for r in b["results"]}
    rows = []
    for key in list(ra) + [k for k in rb if k not in ra]:
        for m in METRICS[kind]:
            va, vb = ra.get(key, {}).get(m), rb.get(key, {}).get(m)
            if va is None and vb is None:
                continue
            delta = vb - va if va is not None and vb is not None else None
            rows.append((key, m, va, vb, delta))
    return rows


def compare_table(a: dict, b: dict, name_a: str = "A", name_b: str = "B"):
    from rich.table import Table

    table = Table(title=f"{a['kind']}: {name_a} ({a['model']}) vs {name_b} ({b['model']})")
    for c, j in (("row", "left"), ("metric", "left"), (name_a, "right"), (name_b, "right"), ("delta", "right"), ("delta %", "right")):
        table.add_column(c, justify=j)
    for key, m, va, vb, d in compare_rows(a, b):
        pct = f"{100 * d / va:+.2f}%" if d is not None and va else "-"
        ds = "-" if d is None else f"{d:+.4f}"
        if d is not None and d != 0:
            worse = (d > 0) == (m in LOWER_IS_BETTER)
            ds = f"[{'red' if worse else 'green'}]{ds}[/]"
        table.add_row(key, m, _fmt(va), _fmt(vb), ds, pct)
    return table
