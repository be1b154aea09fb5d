"""Resolve a Hugging Face id (``org/name``) the way transformers does: a local folder of that
name wins, then the snapshot in the local HF cache, then (unless offline) the hub itself.

The cache and offline settings are read from the environment at call time (``HF_HUB_CACHE``,
``HF_HOME``, ``HF_HUB_OFFLINE``), so a changed environment is honoured without re-importing.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")


def looks_like_hub_id(name: str) -> bool:
    return bool(_ID.fullmatch(name)) and ".." not in name


def hub_cache_dir() -> Path:
    env = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if env:
        return Path(env)
    return Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface")) / "hub"


def hub_offline() -> bool:
    return any(os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on") for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def cached_snapshot(repo_id: str) -> Path | None:
    """The folder of ``repo_id``'s cached snapshot (revision main), or None if it is not cached."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, cache_dir=hub_cache_dir(), local_files_only=True))
    except (OSError, ValueError):  # LocalEntryNotFoundError, HFValidationError
        return None
