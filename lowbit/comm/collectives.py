"""What every collective of the quantized all-reduce shares: torch's all-gather under either of
its names, the one error a failed exchange becomes, and scratch buffers kept between calls."""

from __future__ import annotations

import torch
import torch.distributed as dist

from .errors import AllReduceError

# torch >= 2.13 names it all_gather_single; older releases all_gather_into_tensor
all_gather_into = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def guarded(what: str, fn, *args, **kwargs) -> None:
    """Run one collective; a peer that died, timed out or hung up becomes an AllReduceError."""
    try:
        fn(*args, **kwargs)
    except RuntimeError as e:
        raise AllReduceError(
            f"quick all-reduce failed during {what}: a peer rank died, timed out or closed its connection ({e})"
        ) from e


def scratch(ws: dict | None, name: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A scratch tensor, reused across calls when a workspace dict is given: fresh large
    allocations cost page faults on every call (QuickReduce keeps its buffers for the same reason)."""
    if ws is None:
        return torch.empty(shape, dtype=dtype, device=device)
    t = ws.get(name)
    if t is None or t.shape != shape or t.dtype != dtype or t.device != device:
        with torch.inference_mode(False):  # a normal tensor: usable inside and outside inference mode
            t = ws[name] = torch.empty(shape, dtype=dtype, device=device)
    return t


def rank_order_sum(parts) -> torch.Tensor:
    """``parts[0] + parts[1] + ...`` in float32, in rank order: how every rank adds values that
    travelled raw (the outlier channels), so that every rank gets the same bits."""
    it = iter(parts)
    acc = next(it).to(torch.float32, copy=True)  # a new tensor: float() of float32 would alias parts[0]
    for p in it:
        acc += p.float()
    return acc
