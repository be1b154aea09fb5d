"""The two-shot all-reduce under a channel plan (``+h`` / ``+oN``), its fused rounds of whole tokens
(``lowbit.comm.twoshot.two_shot_channels``, what ``QuickAllReduce`` runs) against the composition it
replaced, built here from the same library pieces: ``ChannelPlan.split`` (a float32 copy of the
message, channels zeroed, block Hadamard), the flat two-shot of that rest (``twoshot.pipelined``),
the outlier channels' all-gather, ``ChannelPlan.merge``. Both in the same ranks, interleaved in
alternating order every repeat, the same bits asserted, medians.

    .venv/bin/python scripts/twoshot_channels_ab.py [--codecs int4+h,int4+h+o16,int3+h+o16]
        [--mib 16] [--world 2] [--repeats 21] [--json OUT]

bf16 messages of ``--mib`` MiB per rank, hidden 576, 1 thread per rank, gloo on this machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _composed(q, x: torch.Tensor, plan) -> None:
    """The previous algorithm, in place: split, flat two-shot of the float32 rest, merge."""
    from lowbit.comm.collectives import all_gather_into, rank_order_sum, scratch
    from lowbit.comm.twoshot import pipelined

    ws = q._workspaces[0]
    rest, outl = plan.split(x, ws)
    gathered = scratch(ws, "outl_all", (q.world_size, outl.numel()), outl.dtype, outl.device)
    work = all_gather_into(gathered.view(-1), outl.reshape(-1), group=q.group, async_op=True) if outl.numel() else None
    pipelined(rest.view(-1), q._chunk_elems(4), q.codec, q.group, q._workspaces, q.pipeline_depth)
    osum = None
    if work is not None:
        work.wait()
        osum = rank_order_sum(gathered).view(-1, outl.shape[-1])
    plan.merge(rest, osum, x)


def rank_main(rank: int, world: int, codecs: list[str], mib: int, repeats: int) -> dict:
    import torch.distributed as dist

    from lowbit.comm.allreduce import QuickAllReduce
    from lowbit.comm.channels import spread_channels
    from lowbit.comm.codecs import parse_spec

    torch.set_num_threads(1)
    hidden = 576
    x0 = torch.randn(mib * (1 << 20) // 2 // hidden, hidden, generator=torch.Generator().manual_seed(rank)).bfloat16()
    res = {}
    for name in codecs:
        n = parse_spec(name).outliers
        q = QuickAllReduce(codec=name, min_bytes=0, table={}, twoshot_min_bytes=0, hidden=hidden,
                           outliers=spread_channels(n, hidden) if n else None)
        runs = {"composed": lambda t: _composed(q, t, q.plan), "fused": q.all_reduce}
        times, outs = {k: [] for k in runs}, {}
        for rep in range(repeats + 1):  # the first round of each warms the buffers, untimed
            for k in (list(runs) if rep % 2 else list(runs)[::-1]):
                t = x0.clone()
                dist.barrier()
                a = time.perf_counter()
                runs[k](t)
                if rep:
                    times[k].append(time.perf_counter() - a)
                outs[k] = t
        assert torch.equal(outs["composed"].view(torch.uint8), outs["fused"].view(torch.uint8)), name
        res[name] = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    return res


def main() -> int:
    from lowbit.parallel.launch import check_results, run_ranks

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--codecs", default="int4+h,int4+h+o16,int3+h+o16")
    ap.add_argument("--mib", type=int, default=16, help="message size per rank, MiB of bf16")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=21)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    codecs = [c for c in a.codecs.split(",") if c]
    res = check_results(run_ranks(rank_main, a.world, codecs, a.mib, a.repeats, timeout_s=120, deadline_s=1800))
    rows = []
    for name in codecs:
        c, f = res[0][name]["composed"], res[0][name]["fused"]
        rows.append({"codec": name, "mib": a.mib, "world": a.world, "composed_ms": c, "fused_ms": f, "speedup": c / f,
                     "per_rank": [{k: r[name][k] for k in ("composed", "fused")} for r in res]})
        print(f"{name:12s} {a.mib} MiB, world {a.world}: split + flat two-shot + merge {c:.2f} ms, "
              f"fused rounds {f:.2f} ms -> {c / f:.2f}x (same bits on every rank)")
    if a.json:
        a.json.write_text(json.dumps({"meta": vars(a) | {"json": str(a.json)}, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
