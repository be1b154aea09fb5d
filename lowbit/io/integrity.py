"""Hashes that tie a checkpoint's two halves together, so an edit of either is caught on load.

``lowbit_config.json`` records the SHA-256 of ``model.safetensors`` (and, inside the part the
header hashes, of ``config.json`` and the tokenizer's files); the safetensors header
records ``"format": "lowbit"`` (the marker that tells a lowbit checkpoint from a plain Hugging
Face one) and the SHA-256 of the config's canonical content without its ``weights`` entry. Hand-
edited files load only with ``trust_edits=True`` or ``LOWBIT_TRUST_EDITED_CHECKPOINT=1``.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

MARKER = "lowbit"
TRUST_ENV = "LOWBIT_TRUST_EDITED_CHECKPOINT"
CONFIG_HASH_KEY = "lowbit_config_sha256"


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def config_digest(meta: dict) -> str:
    """SHA-256 of ``meta`` minus ``weights`` (which names the tensors' own hash), as sorted JSON."""
    body = {k: v for k, v in meta.items() if k != "weights"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=float)
    return hashlib.sha256(text.encode()).hexdigest()


def tensors_metadata(path: str | os.PathLike) -> dict | None:
    """The ``__metadata__`` of a safetensors file, read from its header alone; None if it is not
    a readable safetensors file."""
    try:
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if not 0 < n <= 100 << 20:
                return None
            header = json.loads(f.read(n))
    except (OSError, ValueError):
        return None
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    return meta if isinstance(meta, dict) else {}


def has_marker(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a safetensors file written by lowbit."""
    meta = tensors_metadata(path) if Path(path).is_file() else None
    return bool(meta) and meta.get("format") == MARKER


def trusting(trust_edits: bool | None) -> bool:
    """The explicit argument, else ``$LOWBIT_TRUST_EDITED_CHECKPOINT`` (1/true/yes)."""
    if trust_edits is not None:
        return bool(trust_edits)
    return os.environ.get(TRUST_ENV, "").strip().lower() in ("1", "true", "yes")
