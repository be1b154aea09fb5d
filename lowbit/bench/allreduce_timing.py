"""Measurements shared by ``lowbit bench`` and ``lowbit tune``: run on every rank of a group.

Times are per call, the slowest rank's time (an all-reduce is done when the last rank is done),
median over repeats, after one warm-up call.
"""

from __future__ import annotations

import statistics
import time
import warnings

import torch
import torch.distributed as dist

from lowbit.comm.allreduce import QuickAllReduce
from lowbit.comm.codecs import decode, encode, fp_wire_dtype, get_codec
from lowbit.comm.policy import NO_MAX

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _device() -> torch.device:
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def timed_collective(op, x: torch.Tensor, repeats: int) -> float:
    """Median over repeats of the slowest rank's seconds for ``op(fresh copy of x)``."""
    dev = x.device
    times = []
    for i in range(repeats + 1):
        t = x.clone()
        _sync(dev)
        dist.barrier()
        t0 = time.perf_counter()
        op(t)
        _sync(dev)
        dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64, device=dev)
        dist.all_reduce(dt, op=dist.ReduceOp.MAX)
        if i:  # the first call warms up buffers and connections
            times.append(float(dt))
    return statistics.median(times)


def rank_input(n: int, dtype: torch.dtype, device: torch.device, seed: int = 0) -> torch.Tensor:
    """Activation-like data: Gaussian with a few large outliers, different on every rank."""
    g = torch.Generator().manual_seed(seed * 7919 + dist.get_rank())
    x = torch.randn(n, generator=g)
    idx = torch.randint(0, n, (max(1, n // 1000),), generator=g)
    x[idx] *= 20
    return x.to(dtype).to(device)


def sqnr_db(exact: torch.Tensor, got: torch.Tensor) -> float:
    e = (got.double() - exact).pow(2).sum()
    s = exact.pow(2).sum()
    return float("inf") if float(e) == 0 else float(10 * torch.log10(s / e))


def allreduce_sweep(rank: int, world: int, sizes: list[int], codecs: list[str], dtype_name: str, repeats: int,
                    check_metadata: bool = True, serial: bool = False, hidden: int = 576) -> list[dict]:
    """Plain vs each codec at each message size (bytes); one row per (size, method). ``serial``:
    also each codec with its rounds run one after another (pipeline depth 1), method "CODEC serial".
    With codecs that take +h / +oN options, messages are whole tokens of ``hidden`` values
    ``[size / hidden, hidden]`` (rounded down, at least one token) and the outlier channels are
    spread evenly (random data has no special channels)."""
    from lowbit.comm.channels import spread_channels
    from lowbit.comm.codecs import parse_spec

    dtype = DTYPES[dtype_name]
    dev = _device()
    es = torch.tensor([], dtype=dtype).element_size()
    rows = []
    specs = {c: parse_spec(c) for c in codecs}
    tokens = not all(s.plain_codec for s in specs.values())

    def make(c, **kw):
        s = specs[c]
        opts = {} if s.plain_codec else {"hidden": hidden, "outliers": spread_channels(s.outliers, hidden) if s.outliers else None}
        return QuickAllReduce(codec=c, min_bytes=0, max_bytes=NO_MAX, table={}, check_metadata=check_metadata, **opts, **kw)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quick = {c: make(c) for c in codecs}
        if serial:
            quick |= {f"{c} serial": make(c, pipeline_depth=1) for c in codecs}
    for size in sizes:
        n = max(1, size // es)
        if tokens:
            n = max(1, n // hidden) * hidden
        x = rank_input(n, dtype, dev, seed=size % 1000)
        if tokens:
            x = x.view(-1, hidden)
        exact = x.double()
        dist.all_reduce(exact)
        plain = timed_collective(lambda t: dist.all_reduce(t), x, repeats)
        ref = x.clone()
        dist.all_reduce(ref)
        rows.append({"size_bytes": n * es, "method": "plain", "seconds": plain, "sqnr_db": sqnr_db(exact, ref)})
        for c in quick:
            q = quick[c]
            secs = timed_collective(q.all_reduce, x, repeats)
            got = q.all_reduce(x.clone())
            rows.append({"size_bytes": n * es, "method": c, "seconds": secs, "sqnr_db": sqnr_db(exact, got)})
    return rows if rank == 0 else []


def codec_cost(codec: str, n: int, dtype: torch.dtype, device: torch.device, repeats: int) -> tuple[float, float]:
    """(encode, decode-to-fp32) seconds per element, median of repeats."""
    c = get_codec(codec)
    x = torch.randn(n, dtype=torch.float32, device=device).to(dtype)
    fpw = fp_wire_dtype(dtype)
    enc, dec = [], []
    for i in range(repeats + 1):
        _sync(device)
        t0 = time.perf_counter()
        w = encode(x, c)
        _sync(device)
        t1 = time.perf_counter()
        decode(w, c, n, torch.float32, fp_wire=fpw)
        _sync(device)
        t2 = time.perf_counter()
        if i:
            enc.append(t1 - t0)
            dec.append(t2 - t1)
    return statistics.median(enc) / n, statistics.median(dec) / n


def forced_path(codec: str, path: str) -> QuickAllReduce:
    """A QuickAllReduce that takes ``path`` ("oneshot" or "twoshot") for every message, metadata
    check on (cached after the warm-up call, as in use)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return QuickAllReduce(codec=codec, min_bytes=0, max_bytes=NO_MAX, table={},
                              twoshot_min_bytes=NO_MAX if path == "oneshot" else 0)


def tune_measure(rank: int, world: int, sizes: list[int], codecs: list[str], dtypes: list[str], repeats: int,
                 codec_elems: int) -> dict:
    """Per dtype: plain all-reduce times per size (the link); per codec: the one-shot and two-shot
    times per size, and the codec costs (the slowest rank's)."""
    dev = _device()
    out: dict = {"plain": {}, "codec": {}, "oneshot": {}, "twoshot": {}}
    for dn in dtypes:
        dtype = DTYPES[dn]
        es = torch.tensor([], dtype=dtype).element_size()
        inputs = {s: rank_input(max(1, s // es), dtype, dev) for s in sizes}
        out["plain"][dn] = [(s, timed_collective(lambda t: dist.all_reduce(t), inputs[s], repeats)) for s in sizes]
        for c in codecs:
            for path in ("oneshot", "twoshot"):
                q = forced_path(c, path)
                out[path][f"{c}/{dn}"] = [(s, timed_collective(q.all_reduce, inputs[s], repeats)) for s in sizes]
            cost = codec_cost(c, codec_elems, dtype, dev, repeats)
            t = torch.tensor(cost, dtype=torch.float64, device=dev)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the slowest rank sets the pace
            out["codec"][f"{c}/{dn}"] = tuple(float(v) for v in t)
    return out if rank == 0 else {}
