"""Benchmark output helpers: atomic CSV/PNG writes (JSON: the one writer, lowbit.io.atomic.write_json,
importable from here too), byte-size formatting."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from lowbit.io.atomic import atomic_path, write_json, write_text

__all__ = ["args_meta", "atomic_write", "fmt_bytes", "save_figure", "write_csv", "write_json"]


def args_meta(args, drop: tuple[str, ...] = ()) -> dict:
    """A benchmark's parsed arguments as JSON values for its ``meta``: paths as text, the CLI's
    dispatch function (and the names in ``drop``) left out."""
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
            if not callable(v) and k not in drop}


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" or n == int(n) else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} GiB"


def atomic_write(path: Path, text: str) -> None:
    write_text(path, text)


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
