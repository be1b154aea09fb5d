"""Check where a command will write before it does any work, so a bad ``--out`` or ``--json``
fails in a second with one clear line instead of after minutes of quantization."""

from __future__ import annotations

import os
from pathlib import Path

from lowbit.errors import LowbitError


class OutputPathError(LowbitError, ValueError):
    """An output path cannot be written: a folder where a file goes, a read-only folder, ..."""


def _writable_ancestor(path: Path, flag: str) -> None:
    """The nearest existing folder above ``path`` must be a writable folder (it gets created below it)."""
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise OutputPathError(f"{flag} {path}: {parent} is not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputPathError(f"{flag} {path}: cannot write in {parent} (read-only or not yours)")


def check_output_file(path: str | os.PathLike | None, flag: str) -> None:
    """A file the command will write (or append to): not a folder, and its folder writable."""
    if path is None:
        return
    p = Path(path)
    if p.is_dir():
        raise OutputPathError(f"{flag} {p} is a folder; give a file path")
    if p.exists() and not os.access(p, os.W_OK):
        raise OutputPathError(f"{flag} {p} is read-only")
    _writable_ancestor(p, flag)


def check_output_dir(path: str | os.PathLike | None, flag: str) -> None:
    """A folder the command will write files into: not a file, and writable."""
    if path is None:
        return
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise OutputPathError(f"{flag} {p} is a file; give a folder")
    if p.is_dir():
        if not os.access(p, os.W_OK | os.X_OK):
            raise OutputPathError(f"{flag} {p}: cannot write in it (read-only or not yours)")
        return
    _writable_ancestor(p, flag)
