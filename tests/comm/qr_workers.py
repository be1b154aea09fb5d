"""Functions that run on each rank in the distributed tests (importable by the forkserver)."""

from __future__ import annotations

import os
import warnings

import torch
import torch.distributed as dist

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def rank_input(rank: int, n: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    x = torch.randn(n, generator=g) * (1 + rank)
    x[:: max(1, n // 7)] *= 8  # a few outliers so blocks have different scales
    return x.to(dtype)


def reduce_cases(rank: int, world: int, cases: list[tuple]) -> tuple[list[torch.Tensor], list[str]]:
    """Quick all-reduce of each (codec, dtype, n, seed, noncontig[, chunked]) case; results and warnings."""
    from lowbit.comm.allreduce import QuickAllReduce

    out = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for codec, dtype_name, n, seed, noncontig, *rest in cases:
            x = rank_input(rank, n, DTYPES[dtype_name], seed)
            chunk = {"chunk_bytes": 1} if rest and rest[0] else {}  # 1: the smallest rounds, W rows each
            qar = QuickAllReduce(codec=codec, min_bytes=0, table={}, twoshot_min_bytes=0, **chunk)
            if noncontig:
                buf = torch.zeros(n, 2, dtype=x.dtype)
                buf[:, 0] = x
                t = buf[:, 0]
                assert not t.is_contiguous()
                qar.all_reduce(t)
                assert torch.equal(buf[:, 1], torch.zeros_like(buf[:, 1]))
                out.append(t.clone())
            else:
                t = x.clone()
                qar.all_reduce(t)
                out.append(t)
            assert qar.last_path == codec
    return out, [str(w.message) for w in caught]


def plain_vs_quick_small(rank: int, world: int) -> dict:
    """Below min_bytes QuickAllReduce must be exactly dist.all_reduce."""
    from lowbit.comm.allreduce import QuickAllReduce

    x = rank_input(rank, 300, torch.float32, 5)
    ref = x.clone()
    dist.all_reduce(ref)
    qar = QuickAllReduce(codec="int4", min_bytes=1 << 20, table={})
    t = x.clone()
    qar.all_reduce(t)
    small_path = qar.last_path
    big = QuickAllReduce(codec="int4", min_bytes=0, max_bytes=100, table={})
    t2 = x.clone()
    big.all_reduce(t2)  # 1200 bytes > max_bytes: plain too
    os.environ["LOWBIT_QR_MIN_BYTES"] = "0"
    env = QuickAllReduce(codec="int4", min_bytes=1 << 30, table={})
    t3 = x.clone()
    env.all_reduce(t3)
    del os.environ["LOWBIT_QR_MIN_BYTES"]
    ints = torch.arange(10, dtype=torch.int64) * (rank + 1)
    QuickAllReduce(codec="int4", min_bytes=0, table={}, twoshot_min_bytes=0).all_reduce(ints)
    return {
        "small_equal": torch.equal(t, ref), "small_path": small_path,
        "max_equal": torch.equal(t2, ref), "max_path": big.last_path,
        "env_path": env.last_path, "ints": ints.tolist(),
    }


def mismatched(rank: int, world: int, kind: str) -> str:
    from lowbit.comm.allreduce import QuickAllReduce

    n = 4096 + (rank if kind == "size" else 0)
    dtype = torch.float16 if (kind == "dtype" and rank == 1) else torch.float32
    qar = QuickAllReduce(codec="int4", min_bytes=0, table={}, twoshot_min_bytes=0)
    try:
        qar.all_reduce(torch.ones(n, dtype=dtype))
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return "no error"


def dead_peer(rank: int, world: int) -> str:
    from lowbit.comm.allreduce import QuickAllReduce

    qar = QuickAllReduce(codec="int4", min_bytes=0, table={}, twoshot_min_bytes=0, check_metadata=(world > 0))
    if rank == world - 1:
        os._exit(3)  # dies without a word
    try:
        qar.all_reduce(torch.ones(8192))
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return "no error"


def nonfinite(rank: int, world: int, codec: str) -> torch.Tensor:
    from lowbit.comm.allreduce import QuickAllReduce

    x = rank_input(rank, 3 * 2048, torch.float32, 11)
    if rank == 0:
        x[100] = float("nan")
        x[5000] = float("inf")
    QuickAllReduce(codec=codec, min_bytes=0, table={}, twoshot_min_bytes=0).all_reduce(x)
    return x


def fp16_overflow(rank: int, world: int, codec: str) -> tuple[torch.Tensor, torch.Tensor]:
    from lowbit.comm.allreduce import QuickAllReduce

    x = rank_input(rank, 4096, torch.float16, 12)
    x[10] = 60000.0
    x[11] = -60000.0
    x[3000] = 40000.0
    ref = x.clone()
    dist.all_reduce(ref)
    QuickAllReduce(codec=codec, min_bytes=0, table={}, twoshot_min_bytes=0).all_reduce(x)
    return x, ref


def faults_and_fallbacks(rank: int, world: int) -> dict:
    """Several cheap checks in one group (the group survives a metadata mismatch)."""
    out = {"fallback": plain_vs_quick_small(rank, world)}
    out["size"] = mismatched(rank, world, "size")
    out["dtype"] = mismatched(rank, world, "dtype")
    out["after_mismatch"] = reduce_cases(rank, world, [("int4", "float32", 100, 9, False)])[0][0]
    out["nonfinite"] = {c: nonfinite(rank, world, c) for c in ("int4", "fp4", "fp")}
    out["overflow"] = {c: fp16_overflow(rank, world, c) for c in ("int8", "int3", "fp4", "fp")}
    return out


def fp_and_plain(rank: int, world: int, cases: list[tuple]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(QuickAllReduce "fp" result, dist.all_reduce result) for each (dtype, n, seed) case."""
    from lowbit.comm.allreduce import QuickAllReduce

    qar = QuickAllReduce(codec="fp", min_bytes=0, table={}, twoshot_min_bytes=0)
    out = []
    for dtype_name, n, seed in cases:
        x = rank_input(rank, n, DTYPES[dtype_name], seed)
        ref = x.clone()
        dist.all_reduce(ref)
        qar.all_reduce(x)
        out.append((x, ref))
    return out


def pipeline_variants(rank: int, world: int, cases: list[tuple]) -> list[list[torch.Tensor]]:
    """Each (codec, dtype, n, seed) case reduced four ways: one round, then rounds of W rows run
    one at a time (depth 1), two in flight and three in flight (the default)."""
    from lowbit.comm.allreduce import QuickAllReduce

    out = []
    for codec, dtype_name, n, seed in cases:
        x = rank_input(rank, n, DTYPES[dtype_name], seed)
        res = []
        for chunk, depth in ((0, 1), (1, 1), (1, 2), (1, 3)):
            t = x.clone()
            QuickAllReduce(codec=codec, min_bytes=0, table={}, twoshot_min_bytes=0, chunk_bytes=chunk, pipeline_depth=depth).all_reduce(t)
            res.append(t)
        t = x.clone()  # a reused object: the per-round buffers are kept and must not leak between calls
        q = QuickAllReduce(codec=codec, min_bytes=0, table={}, twoshot_min_bytes=0, chunk_bytes=1)
        q.all_reduce(x.clone() * 3)
        q.all_reduce(t)
        res.append(t)
        out.append(res)
    return out


def inference_mode_then_normal(rank: int, world: int) -> list[torch.Tensor]:
    """The kept buffers made during torch.inference_mode() must serve later calls outside it."""
    from lowbit.comm.allreduce import QuickAllReduce

    q = QuickAllReduce(codec="int4", min_bytes=0, table={}, twoshot_min_bytes=0)
    outs = []
    for mode in (True, False, True):
        with torch.inference_mode(mode):
            t = rank_input(rank, 5000, torch.float16, 41)
            q.all_reduce(t)
        outs.append(t.clone())
    return outs


BIG = {  # (index, value on rank 0, value on rank 1): finite sums at the edges of each dtype's range
    "float32": [(5, 1e6, 1.0), (100, 3e38, -1.0), (2100, -3.4028234663852886e38, 0.5), (3000, 524033.0, 2.0)],
    "bfloat16": [(5, 1e6, 1.0), (100, 3e38, -1.0), (2100, 3.3895313892515355e38, 0.0), (3000, -393216.0, 2.0)],
    "float16": [(5, 65504.0, -1.0), (100, -65504.0, 0.0), (2100, 65504.0, 0.0), (3000, 32768.0, 30000.0)],
}


def range_input(rank: int, n: int, dtype_name: str, seed: int) -> torch.Tensor:
    x = rank_input(rank, n, DTYPES[dtype_name], seed)
    for i, v0, v1 in BIG[dtype_name]:
        x[i] = v0 if rank == 0 else v1
    return x


def range_cases(rank: int, world: int, cases: list[tuple]) -> list[torch.Tensor]:
    """Quick all-reduce of each (codec, dtype, n, seed, native) case of :func:`range_input`;
    native False: the torch codec path (LOWBIT_QR_NATIVE=0)."""
    from lowbit.comm.allreduce import QuickAllReduce

    out = []
    for codec, dtype_name, n, seed, use_native in cases:
        os.environ["LOWBIT_QR_NATIVE"] = "1" if use_native else "0"
        t = range_input(rank, n, dtype_name, seed)
        q = QuickAllReduce(codec=codec, min_bytes=0, table={}, twoshot_min_bytes=0)
        q.all_reduce(t)
        assert q.last_path == codec
        out.append(t)
    os.environ.pop("LOWBIT_QR_NATIVE", None)
    return out


def tie_free(x: torch.Tensor) -> torch.Tensor:
    """x with one value of largest magnitude per 32-value block (that value times 1.25): the
    reference codec and the fast one break a +m/-m tie differently (the fast codecs take the
    first, the formats' signed absmax the positive one), which is not what these tests check."""
    from lowbit.comm.codecs.fast import as_rows

    n = x.numel()
    b = as_rows(x.float()).reshape(-1, 32).clone()
    idx = b.abs().argmax(dim=1, keepdim=True)
    b.scatter_(1, idx, b.gather(1, idx) * 1.25)
    return b.reshape(-1)[:n].to(x.dtype)


def oneshot_input(rank: int, n: int, dtype_name: str, seed: int, ties: bool) -> torch.Tensor:
    x = rank_input(rank, n, DTYPES[dtype_name], seed)
    return x if ties else tie_free(x)


def oneshot_cases(rank: int, world: int, cases: list[tuple]) -> dict:
    """One-shot all-reduce of each (codec, dtype, n, seed, ties) case, the paths taken, and how many
    metadata exchanges ran over three calls of each case (the check is cached per job)."""
    from lowbit.comm.allreduce import QuickAllReduce

    out, paths, checks = [], [], []
    for codec, dtype_name, n, seed, ties in cases:
        q = QuickAllReduce(codec=codec, min_bytes=0, table={}, twoshot_min_bytes=1 << 40)
        for _ in range(3):
            t = oneshot_input(rank, n, dtype_name, seed, ties)
            q.all_reduce(t)
        paths.append((q.last_path, q.last_shot, q.path(t)))
        checks.append(q.checked.checks)
        out.append(t)
    return {"out": out, "paths": paths, "checks": checks}


def oneshot_edges(rank: int, world: int) -> dict:
    """Non-finite input and float16 overflow on the one-shot path, next to dist.all_reduce."""
    from lowbit.comm.allreduce import QuickAllReduce

    q = QuickAllReduce(codec="int4", min_bytes=0, table={}, twoshot_min_bytes=1 << 40)
    x = rank_input(rank, 3 * 2048, torch.float32, 11)
    if rank == 0:
        x[100], x[5000] = float("nan"), float("inf")
    q.all_reduce(x)
    h = rank_input(rank, 4096, torch.float16, 12)
    h[10], h[11] = 60000.0, -60000.0
    ref = h.clone()
    dist.all_reduce(ref)
    q.all_reduce(h)
    return {"nonfinite": x, "f16": h, "f16_ref": ref, "shot": q.last_shot}


def always_checked(rank: int, world: int) -> dict:
    """check_metadata="always": a rank that changes its size after a checked call still gets
    MetadataMismatchError on every rank; the default caches the check (one exchange per job)."""
    from lowbit.comm.allreduce import QuickAllReduce

    q = QuickAllReduce(codec="int4", min_bytes=0, table={}, check_metadata="always")
    q.all_reduce(torch.ones(4096))
    try:
        q.all_reduce(torch.ones(4096 + rank))
        err = "no error"
    except Exception as e:
        err = f"{type(e).__name__}: {e}"
    cached = QuickAllReduce(codec="int4", min_bytes=0, table={})
    for _ in range(3):
        cached.all_reduce(torch.ones(4096))
    return {"err": err, "always_checks": q.checked.checks, "cached_checks": cached.checked.checks}


def bad_check_setting(rank: int, world: int) -> str:
    from lowbit.comm.allreduce import QuickAllReduce

    try:
        QuickAllReduce(codec="int4", check_metadata="sometimes")
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return "no error"
