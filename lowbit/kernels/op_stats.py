"""Totals of lowbit's linear op in one process (seconds inside it, calls, tokens, the calls of the
first handle registered, which a model's forward makes once, and seconds and calls by the call's
token count, in the ranges of :data:`TOKEN_RANGES`), written as JSON to the file that
``LOWBIT_OP_STATS`` names, four times a second and at exit. ``lowbit bench serve`` reads it from a
vLLM server's engine process to split a step into lowbit's linears and the rest: in a compiled
graph the op's body still runs here, in Python, so it can time itself where nothing else can.
Off unless the variable is set (then a call costs two clock reads).
"""

from __future__ import annotations

import atexit
import os
import threading
import time

from lowbit.io.atomic import write_json

ENV = "LOWBIT_OP_STATS"
INTERVAL_S = 0.25
# a call's token count -> its range: one decode token, batched decode, prompt chunks of growing size
TOKEN_RANGES = ((1, 1), (2, 8), (9, 32), (33, 128), (129, 512), (513, None))


# each range's name (``"9-32"``, ``"1"``, ``"513+"``), made once: the lookup runs in every timed call
RANGE_NAMES = tuple(f"{lo}+" if hi is None else (str(lo) if lo == hi else f"{lo}-{hi}") for lo, hi in TOKEN_RANGES)


def token_range(tokens: int) -> str:
    """The name of the range ``tokens`` falls in."""
    for (_, hi), name in zip(TOKEN_RANGES, RANGE_NAMES):
        if hi is None or tokens <= hi:
            return name
    raise AssertionError("the last range is open")


class OpStats:
    def __init__(self, path: str) -> None:
        self.path = path
        self.seconds, self.calls, self.tokens, self.first_calls = 0.0, 0, 0, 0
        self.by_tokens: dict[str, list] = {}  # range -> [seconds, calls, tokens]
        self.first: str | None = None  # the handle whose calls count forwards
        self._lock = threading.Lock()
        self._written = None
        self._writer_pid: int | None = None  # the process whose writer thread runs (a fork child starts its own)

    def add(self, handle: str, seconds: float, tokens: int) -> None:
        with self._lock:
            self.seconds += seconds
            self.calls += 1
            self.tokens += tokens
            row = self.by_tokens.setdefault(token_range(tokens), [0.0, 0, 0])
            row[0] += seconds
            row[1] += 1
            row[2] += tokens
            if self.first is None or _number(handle) < _number(self.first):
                self.first, self.first_calls = handle, 0
            if handle == self.first:
                self.first_calls += 1
            start = self._writer_pid != os.getpid()  # the first call in this process: the one that runs the model
            if start:
                self._writer_pid = os.getpid()
        if start:
            threading.Thread(target=self._loop, name="lowbit-op-stats", daemon=True).start()
            atexit.register(self._write_quietly)

    def snapshot(self) -> dict:
        with self._lock:
            return {"pid": os.getpid(), "seconds": self.seconds, "calls": self.calls, "tokens": self.tokens,
                    "forwards": self.first_calls, "first_handle": self.first,
                    "by_tokens": {k: list(v) for k, v in self.by_tokens.items()}}

    def write(self) -> None:
        snap = self.snapshot()
        if snap != self._written:
            write_json(self.path, snap)
            self._written = snap

    def _write_quietly(self) -> None:
        try:
            self.write()
        except OSError:  # a folder that went away: timing must never stop the model
            pass

    def _loop(self) -> None:
        while True:
            time.sleep(INTERVAL_S)
            self._write_quietly()


def _number(handle: str) -> int:
    digits = handle.lstrip("abcdefghijklmnopqrstuvwxyz")
    return int(digits) if digits.isdigit() else 0


def from_env() -> OpStats | None:
    path = os.environ.get(ENV, "").strip()
    return OpStats(path) if path else None


STATS = from_env()
