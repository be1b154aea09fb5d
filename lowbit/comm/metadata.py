"""The cheap cross-rank check before an all-reduce: every rank must bring the same job.

Without it, ranks that disagree on the element count or dtype either hang (different message
sizes) or silently add unrelated bytes. One tiny all_gather of five int64 per rank turns that
into a clear error on every rank.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .errors import AllReduceError, MetadataMismatchError

DTYPE_CODES = {torch.float16: 1, torch.bfloat16: 2, torch.float32: 3}
_NAMES = {v: str(k).replace("torch.", "") for k, v in DTYPE_CODES.items()}
# torch >= 2.13 names it all_gather_single; older releases all_gather_into_tensor
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
FIELDS = ("numel", "dtype", "codec", "quick", "ndim")


def signature(t: torch.Tensor, codec_id: int, quick: bool) -> list[int]:
    """This rank's job: element count, dtype code (0: not a float; such tensors take the plain path), codec id, path, ndim."""
    return [t.numel(), DTYPE_CODES.get(t.dtype, 0), codec_id, int(quick), t.dim()]


def _describe(row: list[int], codec_names: list[str]) -> str:
    numel, dt, codec, quick, _ = row
    dtype = _NAMES.get(dt, "unsupported dtype")
    path = f"quick/{codec_names[codec]}" if quick else "plain all_reduce"
    return f"{numel} elements of {dtype} via {path}"


def check_same_job(
    sig: list[int], device: torch.device, group, codec_names: list[str]
) -> None:
    """All-gather every rank's signature; raise the same MetadataMismatchError on all ranks if they differ."""
    world = dist.get_world_size(group)
    mine = torch.tensor(sig, dtype=torch.int64, device=device)
    every = torch.empty(world * len(sig), dtype=torch.int64, device=device)
    try:
        _all_gather(every, mine, group=group)
    except RuntimeError as e:
        raise AllReduceError(f"metadata exchange failed (a peer rank died or timed out): {e}") from e
    rows = every.view(world, len(sig)).tolist()
    if any(r != rows[0] for r in rows):
        lines = [f"  rank {r}: {_describe(row, codec_names)}" for r, row in enumerate(rows)]
        raise MetadataMismatchError("all_reduce called with different jobs on different ranks:\n" + "\n".join(lines))
