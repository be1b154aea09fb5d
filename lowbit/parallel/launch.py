"""Run a function on W ranks: W local processes on gloo (a free 127.0.0.1 port), or under torchrun.

Local ranks come from a forkserver that has already imported torch, so starting 8 ranks costs
one torch import, not eight. Every rank reports ("ok", value) or ("error", message); ``run_ranks``
never hangs: it joins with a deadline and kills what is left.
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import pickle
import socket
import traceback
from collections.abc import Callable
from typing import Any

RankResult = tuple[str, Any]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def under_torchrun() -> bool:
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def join_torchrun(world_size: int, timeout_s: float) -> int:
    """Under torchrun: check that it started ``world_size`` ranks (ValueError naming both) and join
    its process group, gloo (the shards run on the CPU, even where CUDA exists); this rank."""
    import torch.distributed as dist

    if int(os.environ["WORLD_SIZE"]) != world_size:
        raise ValueError(f"--tp {world_size} but torchrun started {os.environ['WORLD_SIZE']} ranks")
    if not dist.is_initialized():
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=timeout_s))
    return dist.get_rank()


def init_group(rank: int, world_size: int, port: int, timeout_s: float, backend: str = "gloo") -> None:
    import torch.distributed as dist

    dist.init_process_group(
        backend,
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )


def _rank_main(fn: Callable, rank: int, world_size: int, port: int, timeout_s: float, args: tuple, queue) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        init_group(rank, world_size, port, timeout_s)
        # every rank is in the mesh before any runs fn: a rank that finished at once and closed its
        # sockets made another's init fail with gloo's "connection closed by peer" instead of giving
        # its own result (seen once in the suite: a setting refused on one rank before the other joined)
        dist.barrier()
        value = fn(rank, world_size, *args)
        queue.put((rank, pickle.dumps(("ok", value))))  # plain bytes: no shared-memory handles that die with us
    except BaseException as e:  # report, never hang the parent
        queue.put((rank, pickle.dumps(("error", f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=3)}"))))
    finally:
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:
                pass


_CTX = None


def _context():
    global _CTX
    if _CTX is None:
        _CTX = mp.get_context("forkserver")
        _CTX.set_forkserver_preload(["torch", "torch.distributed", "lowbit.comm.allreduce"])
    return _CTX


def run_ranks(
    fn: Callable, world_size: int, *args: Any, timeout_s: float = 20.0, deadline_s: float = 120.0
) -> list[RankResult]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` fresh local ranks; results by rank.

    ``timeout_s`` is the process group's timeout (a dead peer surfaces within it); ``deadline_s``
    bounds the whole run: ranks still alive then are killed and reported as errors.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    ctx = _context()
    queue = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(target=_rank_main, args=(fn, r, world_size, port, timeout_s, args, queue), daemon=True)
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    results: dict[int, RankResult] = {}
    import queue as queue_mod
    import time

    end = time.monotonic() + deadline_s
    while len(results) < world_size and time.monotonic() < end:
        try:
            rank, res = queue.get(timeout=0.2)
            results[rank] = pickle.loads(res)
        except queue_mod.Empty:
            if all(not p.is_alive() for p in procs) and queue.empty():
                break
    for p in procs:
        p.join(timeout=max(0.1, end - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join(5)
    out = []
    for r, p in enumerate(procs):
        if r in results:
            out.append(results[r])
        else:
            out.append(("error", f"rank {r} gave no result (exit code {p.exitcode})"))
    return out


def run_here_or_spawn(fn: Callable, world_size: int, *args: Any, timeout_s: float = 60.0, deadline_s: float = 3600.0):
    """Under torchrun, run ``fn`` on this rank (the group is initialised here); else spawn local ranks."""
    if under_torchrun():
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group("nccl" if _cuda() else "gloo", timeout=datetime.timedelta(seconds=timeout_s))
        return [("ok", fn(dist.get_rank(), dist.get_world_size(), *args))]
    return run_ranks(fn, world_size, *args, timeout_s=timeout_s, deadline_s=deadline_s)


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def check_results(results: list[RankResult]) -> list[Any]:
    """Values of every rank, or a RuntimeError that quotes each failing rank."""
    bad = [f"rank {r}: {msg}" for r, (status, msg) in enumerate(results) if status != "ok"]
    if bad:
        raise RuntimeError("distributed run failed:\n" + "\n".join(bad))
    return [v for _, v in results]
