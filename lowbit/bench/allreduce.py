"""``lowbit bench allreduce``: plain ``dist.all_reduce`` vs QuickAllReduce per codec and message size.

Launches its own gloo ranks (or runs under torchrun), prints per size the median latency of each
method, the speedup over plain, the bus bandwidth and the SQNR against the exact float64 sum;
writes CSV, JSON and a PNG of speedup vs message size. ``--link-gbit N`` re-runs itself inside a
network namespace whose loopback is rate-limited to N Gbit/s (root, iproute2).
"""

from __future__ import annotations

import sys
from pathlib import Path


ALL_CODECS = "fp,int8,int6,int4,int3,fp4"


def parse_sizes(text: str, factor: int = 4) -> list[int]:
    """'4K..256M' (every ``factor``-fold step) or '4K,1M,64M' -> bytes."""
    from lowbit.comm.policy import parse_bytes

    if ".." in text:
        lo, hi = (parse_bytes(p) for p in text.split("..", 1))
        if lo <= 0 or hi < lo:
            raise ValueError(f"bad size range {text!r}")
        out, s = [], lo
        while s <= hi:
            out.append(s)
            s *= factor
        return out
    return [parse_bytes(p) for p in text.split(",") if p.strip()]


def _rerun_in_namespace(args) -> int:
    import subprocess

    from lowbit.bench.netns import shaped_namespace

    rest = ["bench", "allreduce", "--world-size", str(args.world_size), "--codecs", args.codecs, "--sizes", args.sizes,
            "--accuracy-elements", str(args.accuracy_elements),
            "--size-factor", str(args.size_factor), "--dtype", args.dtype, "--repeats", str(args.repeats),
            "--timeout", str(args.timeout), "--out", str(args.out), "--label", f"link {args.link_gbit:g} Gbit/s",
            "--hidden", str(args.hidden)]
    if args.no_metadata_check:
        rest.append("--no-metadata-check")
    if args.serial:
        rest.append("--serial")
    code = f"import sys; from lowbit.cli import main; sys.exit(main({rest!r}))"
    with shaped_namespace(args.link_gbit) as prefix:  # a NetnsError is reported by lowbit.cli
        return subprocess.run([*prefix, sys.executable, "-c", code]).returncode


def summarize(rows: list[dict], world: int) -> tuple[list[dict], dict]:
    """Add speedup and bus bandwidth per row; crossover size per codec (speedup >= 1 from there on)."""
    plain = {r["size_bytes"]: r["seconds"] for r in rows if r["method"] == "plain"}
    k = 2 * (world - 1) / world
    out = []
    for r in rows:
        t = r["seconds"]
        out.append({**r, "speedup": plain[r["size_bytes"]] / t, "busbw_GBps": k * r["size_bytes"] / t / 1e9})
    crossover = {}
    for m in sorted({r["method"] for r in out} - {"plain"}):
        pts = sorted((r["size_bytes"], r["speedup"]) for r in out if r["method"] == m)
        cross = None
        for i, (s, _) in enumerate(pts):
            if all(sp >= 1.0 for _, sp in pts[i:]):
                cross = s
                break
        crossover[m] = cross
    return out, crossover


def plot(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .report import save_figure

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for m in sorted({r["method"] for r in rows} - {"plain"}):
        pts = sorted((r["size_bytes"], r["speedup"]) for r in rows if r["method"] == m)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=m)
    ax.axhline(1.0, color="gray", lw=1, ls="--")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size per rank (bytes)")
    ax.set_ylabel("speedup over dist.all_reduce")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    save_figure(fig, path)
    plt.close(fig)


def _check(args) -> None:
    """Arguments argparse cannot check alone, before any rank starts."""
    from lowbit.parallel.launch import under_torchrun
    from lowbit.errors import UsageError
    from lowbit.io.outputs import check_output_dir

    if args.size_factor < 2:
        raise UsageError(f"--size-factor must be >= 2, got {args.size_factor}")
    parse_sizes(args.sizes, args.size_factor)
    if args.world_size < 2 and not under_torchrun():
        raise UsageError("--world-size must be >= 2")
    check_output_dir(args.out, "--out")


def run(args) -> int:
    _check(args)
    if args.link_gbit is not None:
        return _rerun_in_namespace(args)
    from rich.console import Console
    from rich.table import Table

    from lowbit.comm.codecs import parse_spec
    from lowbit.parallel.launch import check_results, run_here_or_spawn
    from lowbit.bench.allreduce_timing import allreduce_sweep

    from .report import fmt_bytes, write_csv, write_json

    codecs = [c.strip() for c in args.codecs.split(",") if c.strip()]
    codecs = [parse_spec(c).name for c in codecs]
    sizes = parse_sizes(args.sizes, args.size_factor)
    res = check_results(run_here_or_spawn(
        allreduce_sweep, args.world_size, sizes, codecs, args.dtype, args.repeats, not args.no_metadata_check, args.serial,
        args.hidden,
        timeout_s=args.timeout, deadline_s=24 * 3600,
    ))
    rows = res[0]
    if not rows:  # torchrun, not rank 0
        return 0
    import torch.distributed as dist

    world = dist.get_world_size() if dist.is_initialized() else args.world_size
    rows, crossover = summarize(rows, world)
    label = args.label or "unshaped loopback"
    title = f"QuickAllReduce speedup, world {world}, {args.dtype}, {label}"
    table = Table(title=title)
    for col in ("size", "method", "median ms", "speedup", "bus GB/s", "SQNR dB"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(fmt_bytes(r["size_bytes"]), r["method"], f"{r['seconds'] * 1e3:.3f}", f"{r['speedup']:.2f}",
                      f"{r['busbw_GBps']:.3f}", f"{r['sqnr_db']:.1f}")
    console = Console()
    console.print(table)
    for m, s in crossover.items():
        console.print(f"crossover {m}: " + (f"{fmt_bytes(s)} and up" if s else "not reached in this range"))
    accuracy = []
    if args.accuracy_elements > 0:
        from lowbit.comm.accuracy import accuracy_report
        from lowbit.bench.allreduce_timing import DTYPES

        # the codecs alone (options act on hidden-size messages; their accuracy is the TP table's)
        accuracy = accuracy_report([c for c in codecs if parse_spec(c).plain_codec], world, args.accuracy_elements,
                                   DTYPES[args.dtype])
        acc_table = Table(title=f"accuracy vs the exact float64 sum, world {world}, {args.dtype}, "
                                f"{args.accuracy_elements} values per rank")
        for col in ("codec", "SQNR dB", "max |err| / bound", "max |err|"):
            acc_table.add_column(col, justify="right")
        for a in accuracy:
            acc_table.add_row(a["codec"], f"{a['sqnr_db']:.1f}", f"{a['max_err_over_bound']:.3f}", f"{a['max_abs_err']:.4g}")
        console.print(acc_table)
    out = args.out
    meta = {"world_size": world, "dtype": args.dtype, "link": label, "repeats": args.repeats,
            "codecs": codecs, "sizes": sizes, "metadata_check": not args.no_metadata_check}
    write_csv(out / "allreduce.csv", rows)
    write_json(out / "allreduce.json", {"meta": meta, "rows": rows, "crossover_bytes": crossover, "accuracy": accuracy})
    plot(rows, out / "allreduce_speedup.png", title)
    console.print(f"wrote {out}/allreduce.csv, allreduce.json, allreduce_speedup.png")
    return 0
