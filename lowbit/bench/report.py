"""Benchmark output helpers: atomic CSV/JSON/PNG writes, byte-size formatting."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from lowbit.io.atomic import atomic_path, write_text


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" or n == int(n) else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} GiB"


def atomic_write(path: Path, text: str) -> None:
    write_text(path, text)


def write_json(path: Path, obj) -> None:
    atomic_write(path, json.dumps(obj, indent=2, default=str))


def write_csv(path: Path, rows: list[dict]) -> None:
    buf = io.StringIO()
    if rows:
        w = csv.DictWriter(buf, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    atomic_write(path, buf.getvalue())


def save_figure(fig, path: Path) -> None:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120, bbox_inches="tight", format=Path(path).suffix.lstrip(".") or "png")
