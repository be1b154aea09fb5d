"""Which path each message takes: plain, one-shot or two-shot, per (codec, world size, dtype).

Messages in the quantize window [min_bytes, max_bytes] are quantized, the others take plain
``dist.all_reduce``. Inside the window, messages below ``twoshot_min_bytes`` take the one-shot
path (one collective: latency-bound messages), the others two-shot (less traffic and codec work
per rank at W > 2, pipelined). Precedence for each of the three numbers: environment
(LOWBIT_QR_MIN_BYTES, LOWBIT_QR_MAX_BYTES, LOWBIT_QR_TWOSHOT_MIN_BYTES) > constructor arguments >
the tuned table (``lowbit tune allreduce`` writes it from measured times of all three paths;
LOWBIT_QR_TABLE names another file) > built-in defaults.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

DEFAULT_MIN_BYTES = 1 << 20  # no table: quantize from 1 MiB (small messages are latency-bound)
DEFAULT_TWOSHOT_MIN_BYTES = 1 << 20  # no table: a forced quantized path (min_bytes=0) is one-shot below 1 MiB
NO_MAX = 1 << 62
ENV_MIN, ENV_MAX, ENV_CODEC, ENV_TABLE = "LOWBIT_QR_MIN_BYTES", "LOWBIT_QR_MAX_BYTES", "LOWBIT_QR_CODEC", "LOWBIT_QR_TABLE"
ENV_TWOSHOT = "LOWBIT_QR_TWOSHOT_MIN_BYTES"


def default_table_path() -> Path:
    env = os.environ.get(ENV_TABLE)
    if env:
        return Path(env)
    return Path(os.environ.get("LOWBIT_CACHE", Path.home() / ".cache" / "lowbit")) / "quickreduce.json"


def table_key(codec: str, world_size: int, dtype: torch.dtype) -> str:
    return f"{codec}/w{world_size}/{str(dtype).replace('torch.', '')}"


def load_table(path: Path | None = None) -> dict:
    """The tuned table, or {} if there is none; a broken file is an error, not a silent default."""
    p = path or default_table_path()
    if not p.exists():
        return {}
    try:
        data = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"size-policy table {p} is not valid JSON: {e}") from e
    if not isinstance(data, dict) or not isinstance(data.get("entries"), dict):
        raise ValueError(f"size-policy table {p} has no 'entries' mapping")
    return data["entries"]


def save_table(entries: dict, meta: dict, path: Path | None = None) -> Path:
    """Write atomically (temp file in the same folder, then os.replace)."""
    from lowbit.io.atomic import write_text

    p = path or default_table_path()
    write_text(p, json.dumps({"meta": meta, "entries": entries}, indent=2, sort_keys=True))
    return p


def _env_bytes(name: str) -> int | None:
    v = os.environ.get(name)
    if v is None or v == "":
        return None
    try:
        return parse_bytes(v)
    except ValueError as e:
        raise ValueError(f"{name}={v!r}: {e}") from None


def parse_bytes(text: str) -> int:
    """'4096', '4K', '1.5M', '2G', 'inf' -> bytes (K/M/G are powers of 1024)."""
    t = str(text).strip().upper().removesuffix("B").removesuffix("I")
    if t in ("INF", "NONE", "MAX"):
        return NO_MAX
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    num = t[:-1] if t[-1:] in "KMG" else t
    try:
        val = float(num)
    except ValueError:
        raise ValueError(f"not a byte size: {text!r}") from None
    if val < 0 or math.isnan(val):
        raise ValueError(f"byte size must be >= 0, got {text!r}")
    return NO_MAX if math.isinf(val) else int(val * mult)


@dataclass
class SizePolicy:
    """Resolves the quantize window for one codec on one group."""

    codec: str
    world_size: int
    min_bytes: int | None = None
    max_bytes: int | None = None
    table: dict | None = None
    twoshot_min_bytes: int | None = None
    # decided paths per (bytes, dtype, environment): a decode step asks 60 times for the same few
    _paths: dict = field(default_factory=dict, repr=False, compare=False)

    def window(self, dtype: torch.dtype) -> tuple[int, int, str]:
        """(min_bytes, max_bytes, where they came from)."""
        entry = (self.table or {}).get(table_key(self.codec, self.world_size, dtype), {})
        lo, hi, src = DEFAULT_MIN_BYTES, NO_MAX, "default"
        if entry:
            lo = int(min(entry.get("min_bytes", lo), NO_MAX))
            hi = int(min(entry.get("max_bytes", hi), NO_MAX))
            src = "table"
        if self.min_bytes is not None or self.max_bytes is not None:
            lo = self.min_bytes if self.min_bytes is not None else lo
            hi = self.max_bytes if self.max_bytes is not None else hi
            src = "arguments"
        env_lo, env_hi = _env_bytes(ENV_MIN), _env_bytes(ENV_MAX)
        if env_lo is not None or env_hi is not None:
            lo = env_lo if env_lo is not None else lo
            hi = env_hi if env_hi is not None else hi
            src = "environment"
        return lo, hi, src

    def twoshot_from(self, dtype: torch.dtype) -> int:
        """Quantized messages from this size on take two-shot, smaller ones one-shot."""
        env = _env_bytes(ENV_TWOSHOT)
        if env is not None:
            return env
        if self.twoshot_min_bytes is not None:
            return self.twoshot_min_bytes
        entry = (self.table or {}).get(table_key(self.codec, self.world_size, dtype), {})
        return int(min(entry.get("twoshot_min_bytes", DEFAULT_TWOSHOT_MIN_BYTES), NO_MAX))

    def use_quick(self, nbytes: int, dtype: torch.dtype) -> bool:
        lo, hi, _ = self.window(dtype)
        return lo <= nbytes <= hi

    def path(self, nbytes: int, dtype: torch.dtype) -> str:
        """"plain", "oneshot" or "twoshot" for a message of ``nbytes`` of ``dtype``; decided once
        per size, dtype and value of the three environment variables (read on every call)."""
        key = (nbytes, dtype, os.environ.get(ENV_MIN), os.environ.get(ENV_MAX), os.environ.get(ENV_TWOSHOT))
        path = self._paths.get(key)
        if path is None:
            if not self.use_quick(nbytes, dtype):
                path = "plain"
            else:
                path = "oneshot" if nbytes < self.twoshot_from(dtype) else "twoshot"
            if len(self._paths) >= 4096:  # ever-new sizes: keep memory bounded
                self._paths.clear()
            self._paths[key] = path
        return path
