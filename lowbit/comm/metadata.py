"""The cheap cross-rank check before an all-reduce: every rank must bring the same job.

Without it, ranks that disagree on the element count or dtype either hang (different message
sizes) or silently add unrelated bytes. One tiny all_gather of five int64 per rank turns that
into a clear error on every rank. :class:`CheckedJobs` runs it once per (shape, dtype, codec,
path) and remembers the jobs that passed: a decode step repeats the same few shapes, and the check
is one more collective latency per call. A rank that brings a job new to it runs the check while
peers that already know theirs do not: their collectives then disagree, which gloo/NCCL report as
an error or a timeout (AllReduceError), no longer as MetadataMismatchError.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .collectives import all_gather_into
from .errors import AllReduceError, MetadataMismatchError

DTYPE_CODES = {torch.float16: 1, torch.bfloat16: 2, torch.float32: 3}
_NAMES = {v: str(k).replace("torch.", "") for k, v in DTYPE_CODES.items()}
FIELDS = ("numel", "dtype", "codec", "path", "ndim", "options", "channels")
PATHS = ("plain", "oneshot", "twoshot")
MAX_CACHED_JOBS = 4096


def options_code(hadamard: int, outliers: int) -> int:
    """The +h / +oN options of a codec spec as one int64 (``lowbit.comm.codecs.spec.CodecSpec``)."""
    return (hadamard << 32) | outliers


def signature(t: torch.Tensor, codec_id: int, path: int | bool, options: int = 0, channels: int = 0) -> list[int]:
    """This rank's job: element count, dtype code (0: not a float; such tensors take the plain
    path), codec id, path (index into PATHS; True means two-shot), ndim, the codec's +h/+oN options
    (:func:`options_code`) and the fingerprint of its hidden size and outlier channels."""
    p = 2 if path is True else int(path)
    return [t.numel(), DTYPE_CODES.get(t.dtype, 0), codec_id, p, t.dim(), options, channels]


def _describe(row: list[int], codec_names: list[str]) -> str:
    numel, dt, codec, path, _, options, channels = row
    dtype = _NAMES.get(dt, "unsupported dtype")
    had, outl = options >> 32, options & 0xFFFFFFFF
    name = codec_names[codec] + (f"+h{had}" if had else "") + (f"+o{outl}" if outl else "")
    how = f"{PATHS[path]}/{name}" if path else "plain all_reduce"
    ch = f" (hidden size and outlier channels #{channels:016x})" if channels else ""
    return f"{numel} elements of {dtype} via {how}{ch}"


def check_same_job(
    sig: list[int], device: torch.device, group, codec_names: list[str]
) -> None:
    """All-gather every rank's signature; raise the same MetadataMismatchError on all ranks if they differ."""
    world = dist.get_world_size(group)
    mine = torch.tensor(sig, dtype=torch.int64, device=device)
    every = torch.empty(world * len(sig), dtype=torch.int64, device=device)
    try:
        all_gather_into(every, mine, group=group)
    except RuntimeError as e:
        raise AllReduceError(f"metadata exchange failed (a peer rank died or timed out): {e}") from e
    rows = every.view(world, len(sig)).tolist()
    if any(r != rows[0] for r in rows):
        lines = [f"  rank {r}: {_describe(row, codec_names)}" for r, row in enumerate(rows)]
        raise MetadataMismatchError("all_reduce called with different jobs on different ranks:\n" + "\n".join(lines))


class CheckedJobs:
    """The jobs (shape, dtype, codec, path) already checked on one group: each checked once."""

    def __init__(self, group, codec_names: list[str]):
        self.group, self.codec_names = group, codec_names
        self._seen: set[tuple] = set()
        self.checks = 0  # exchanges run so far (tests and benchmarks read it)

    def check(self, t: torch.Tensor, codec_id: int, path: int, cached: bool = True, options: int = 0,
              channels: int = 0) -> None:
        """Exchange and compare this job's signature, unless it passed before (``cached=False``: always)."""
        key = (tuple(t.shape), t.dtype, t.device, codec_id, path, options, channels)
        if cached and key in self._seen:
            return
        self.checks += 1
        check_same_job(signature(t, codec_id, path, options, channels), t.device, self.group, self.codec_names)
        if len(self._seen) >= MAX_CACHED_JOBS:  # a caller with ever-new shapes: keep memory bounded
            self._seen.clear()
        self._seen.add(key)
