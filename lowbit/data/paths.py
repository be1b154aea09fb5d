"""Where the shared evaluation and calibration data lives.

Looked up in this order: ``$LOWBIT_DATA``, then ``../shared/data`` beside the repository
(the project's root is found from this file and from the working directory).
"""

from __future__ import annotations

import os
from pathlib import Path


class DataNotFoundError(FileNotFoundError):
    """A data file lowbit needs is not where it looked."""


def data_root() -> Path:
    env = os.environ.get("LOWBIT_DATA")
    if env:
        return Path(env)
    here = Path(__file__).resolve()
    for base in [Path.cwd(), *Path.cwd().parents, *here.parents]:
        cand = base / "shared" / "data"
        if cand.is_dir() and base != Path("/"):
            return cand
        cand = base.parent / "shared" / "data"
        if cand.is_dir():
            return cand
    return Path.cwd().parent / "shared" / "data"


def data_file(relative: str) -> Path:
    """Path of a shared data file, or a clear error naming where it was looked for."""
    path = data_root() / relative
    if not path.is_file():
        raise DataNotFoundError(
            f"data file {relative!r} not found at {path}. Set LOWBIT_DATA to the folder that holds "
            "wikitext2/, ptb/ and zeroshot/ (see ../shared/data/README.md), or pass a file path."
        )
    return path
