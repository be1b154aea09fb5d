"""Atomic file writes: write to a temporary file in the same folder, then rename over the target."""

from __future__ import annotations

import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_path(path: str | os.PathLike):
    """Yield a temporary path beside ``path``; on success rename it to ``path``, else delete it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield tmp
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; give the result a normal file's mode
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def json_value(obj):
    """What JSON cannot hold as is: a number-like object (numpy or 0-d torch scalar) as a float,
    anything else (a path, a dtype) as its string."""
    try:
        return float(obj)
    except (TypeError, ValueError):
        return str(obj)


def write_json(path: str | os.PathLike, obj) -> None:
    """The one JSON writer: indented, newline-terminated, atomic; odd values via :func:`json_value`."""
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=2, default=json_value)
            f.write("\n")


def write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        Path(tmp).write_text(text, encoding="utf-8")


def append_line(path: str | os.PathLike, line: str) -> None:
    """Add one line to a text file (a JSONL log) by rewriting it atomically: a crash leaves the
    old file or the new one, never half a line."""
    path = Path(path)
    old = path.read_text(encoding="utf-8") if path.is_file() else ""
    if old and not old.endswith("\n"):
        old += "\n"
    write_text(path, old + line + "\n")


def _fsync(path: str | os.PathLike) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(folder: str | os.PathLike) -> None:
    """Flush every file in ``folder`` and the folder itself, so a rename that publishes it never
    publishes unwritten data (a crash after the rename would leave empty or torn files)."""
    folder = Path(folder)
    for p in [*folder.iterdir(), folder]:
        _fsync(p)


def fsync_dir(folder: str | os.PathLike) -> None:
    """Flush a folder's entries (a rename is durable only once its folder is); a file system that
    cannot fsync a folder is left as it is."""
    try:
        _fsync(folder)
    except OSError:
        pass
