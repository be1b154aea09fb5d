"""``lowbit bench gemm``: each quantized linear kernel next to fp32 and bf16 ``F.linear``,
measured side by side in one run (every kernel timed in turn within each repeat; medians), with
bytes moved, operations, GB/s, TFLOP/s and the roofline bound, on the default model's and
Llama-7B's shapes.

Roofline: bound = max(bytes / copy bandwidth, ops / peak), with the copy bandwidth measured in
the same run and the peak = the best fp32/bf16 ``F.linear`` rate seen in the run (an empirical
ceiling: this is what the hardware demonstrably does, not a datasheet number).
"""

from __future__ import annotations

from pathlib import Path

from lowbit.bench.report import args_meta


SHAPE_SETS = {  # (name, in_features, out_features)
    "default": [("q/o 576x576", 576, 576), ("k/v 576x192", 576, 192), ("gate/up 576x1536", 576, 1536),
                ("down 1536x576", 1536, 576)],
    "llama7b": [("4096x4096", 4096, 4096), ("4096x11008", 4096, 11008), ("11008x4096", 11008, 4096)],
}
KERNELS = ("fp32", "bf16", "w4a16", "w8a16", "w8a8", "w4a4")


def _methods() -> dict[str, tuple[str, ...]]:
    """The CPU methods each kind offers (``KIND@METHOD``), as its kernel module declares them."""
    from lowbit.kernels.cpu import w4a4, w4a16, w8a8, w8a16

    return {"w4a16": w4a16.METHODS, "w8a16": w8a16.METHODS, "w8a8": w8a8.METHODS,
            "w4a4": w4a4.METHODS}


def parse_shapes(spec: str) -> list[tuple[str, int, int]]:
    """``default,llama7b`` (named sets) and/or ``INxOUT`` items, e.g. ``default,256x64``."""
    import re

    shapes = []
    for item in (s.strip() for s in spec.split(",") if s.strip()):
        if item in SHAPE_SETS:
            shapes += SHAPE_SETS[item]
        elif m := re.fullmatch(r"(\d+)x(\d+)", item):
            n_in, n_out = int(m[1]), int(m[2])
            if n_in < 1 or n_out < 1:
                raise ValueError(f"shape {item!r} must be positive")
            shapes.append((item, n_in, n_out))
        else:
            raise ValueError(f"unknown shape {item!r}: use {', '.join(SHAPE_SETS)} or INxOUT")
    if not shapes:
        raise ValueError("no shapes given")
    return shapes


def median_time(fn, repeats: int, sync, max_seconds: float = float("inf"), amortize: bool = False) -> tuple[float, int]:
    """(median seconds per call, repeats done) of one callable: :func:`interleaved_medians` of one."""
    return interleaved_medians({"": fn}, repeats, sync, max_seconds, amortize)[""]


def interleaved_medians(fns: dict, repeats: int, sync, max_seconds: float = float("inf"),
                        amortize: bool = False) -> dict:
    """``{name: (median seconds per call, repeats done)}`` after one warm-up call each; every repeat
    times each callable once in turn, so a machine that speeds up or slows down during the run
    (shared hosts: 2x swings seen within a minute) shifts every row alike and the ratios hold.
    A callable whose warm-up took longer than ``max_seconds`` is timed once.

    ``amortize`` (GPUs): each timing is a loop of calls long enough (~5 ms) that the launch
    and synchronisation overhead of one call does not dominate, divided by the loop length,
    which is how kernels run back to back inside a model.
    """
    import statistics
    import time

    def timed(fn, inner: int) -> float:
        sync()
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        sync()
        return (time.perf_counter() - t0) / inner

    plan = {}
    for name, fn in fns.items():
        first = timed(fn, 1)
        inner = max(1, min(1000, int(0.005 / max(timed(fn, 1), 1e-7)))) if amortize else 1
        plan[name] = (1 if first > max_seconds else repeats, inner)
    ts = {name: [] for name in fns}
    for r in range(max(n for n, _ in plan.values()) if plan else 0):
        for name, fn in fns.items():
            if r < plan[name][0]:
                ts[name].append(timed(fn, plan[name][1]))
    return {name: (statistics.median(v), len(v)) for name, v in ts.items()}


def tensor_bytes(obj) -> int:
    """Bytes of every tensor a prepared kernel state holds (what a call must read)."""
    import dataclasses

    import torch

    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if dataclasses.is_dataclass(obj):
        return sum(tensor_bytes(getattr(obj, f.name)) for f in dataclasses.fields(obj))
    return 0


def _last_level_cache(dev) -> int:
    """Bytes of the last-level cache: the GPU's L2, or the CPU's L3 (Linux sysfs; 32 MiB if unknown)."""
    import torch

    if dev.type == "cuda":
        return getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 64 << 20)
    try:
        size = Path("/sys/devices/system/cpu/cpu0/cache/index3/size").read_text().strip()
        return int(size[:-1]) << {"K": 10, "M": 20}[size[-1]] if size[-1] in "KM" else int(size)
    except (OSError, ValueError, IndexError):
        return 32 << 20


def _copies(dev, weight_bytes: int) -> int:
    """Weight copies to rotate through, so that repeated calls stream the weights from memory
    instead of finding them in the last-level cache (as decode does: a model's layers do not fit)."""
    return max(1, min(16, -(-4 * _last_level_cache(dev) // max(weight_bytes, 1))))


def _copy_bandwidth(dev, sync, repeats: int) -> float:
    import torch

    x = torch.empty((1 << 30) if dev.type == "cuda" else (64 << 20), dtype=torch.uint8, device=dev).fill_(1)
    y = torch.empty_like(x)
    s, _ = median_time(lambda: y.copy_(x), repeats, sync, amortize=dev.type == "cuda")
    return 2 * x.numel() / s  # read + write


def run(args) -> int:
    import itertools

    import torch
    import torch.nn.functional as F
    from rich.console import Console
    from tqdm.auto import tqdm

    from lowbit.errors import UsageError
    from lowbit.io.outputs import check_output_dir
    from lowbit.kernels import from_float, prepare

    from . import machine
    from .report import write_csv, write_json

    if args.threads:
        torch.set_num_threads(args.threads)
    console = Console(width=max(160, Console().width))
    dev = torch.device(args.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda but no CUDA device is available")
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    shapes = parse_shapes(args.shapes)
    batches = [int(b) for b in args.batches.split(",")]
    # the float baselines always run: a quantized kernel is judged against the faster of the two here
    kernels = list(dict.fromkeys(["fp32", "bf16"] + [k.strip() for k in args.kernels.split(",") if k.strip()]))
    methods = _methods()
    bad = [k for k in kernels if k.split("@")[0] not in KERNELS or ("@" in k and k.split("@")[1] not in methods.get(k.split("@")[0], ()))]
    if bad or not kernels:
        methods = "; ".join(f"{k}@{'|'.join(m)}" for k, m in methods.items())
        raise UsageError(f"--kernels {args.kernels!r}: choose from {', '.join(KERNELS)}; methods {methods}")
    check_output_dir(args.out, "--out")
    copy_bw = _copy_bandwidth(dev, sync, args.repeats)
    rows = []
    with tqdm(total=len(shapes) * (len(kernels) + len(batches)), desc="gemm", disable=None) as bar:
        for sname, n_in, n_out in shapes:
            torch.manual_seed(0)
            w32 = torch.randn(n_out, n_in) / n_in ** 0.5
            prepared = {}  # kernel -> (calls over weight copies, impl, weight bytes, input dtype)
            for kname in kernels:
                bar.set_postfix_str(f"{sname} prepare {kname}")
                if kname in ("fp32", "bf16"):
                    dt = torch.float32 if kname == "fp32" else torch.bfloat16
                    ws = [w32.to(device=dev, dtype=dt) for _ in range(_copies(dev, w32.numel() * dt.itemsize))]
                    prepared[kname] = ([lambda x, w=w: F.linear(x, w) for w in ws], "F.linear", tensor_bytes(ws[0]), dt)
                else:
                    kind, _, method = kname.partition("@")
                    # Atom keeps 128 of 4096 channels in INT8; the default model's preset keeps 32
                    k = (128 if n_in >= 4096 else 32) if kind == "w4a4" else 0
                    p = from_float(w32, kind, group=128, n_outliers=k, act_clip=0.9)
                    pl = prepare(p, dev, args.kernel, cpu_method=method or None)
                    calls = [pl] + [prepare(p, dev, args.kernel, cpu_method=method or None)
                                    for _ in range(_copies(dev, tensor_bytes(pl.state)) - 1)]
                    # weight-only kinds run inside bf16 models (bench decode, vLLM), the others in fp32 ones
                    xdt = torch.bfloat16 if kind in ("w4a16", "w8a16") else torch.float32
                    prepared[kname] = (calls, pl.kernel, tensor_bytes(pl.state), xdt)
                bar.update(1)
            for t in batches:  # every kernel of this batch timed in turn within each repeat
                bar.set_postfix_str(f"{sname} batch {t}")
                x32 = torch.randn(t, n_in, device=dev)
                xs = {kname: x32.to(xdt) for kname, (_, _, _, xdt) in prepared.items()}
                fns = {kname: (lambda c=itertools.cycle(calls), x=xs[kname]: next(c)(x))
                       for kname, (calls, _, _, _) in prepared.items()}
                timed = interleaved_medians(fns, args.repeats, sync, args.max_seconds,
                                            amortize=dev.type == "cuda" or getattr(args, "back_to_back", False))
                for kname, (_, impl, wbytes, xdt) in prepared.items():
                    sec, n = timed[kname]
                    x = xs[kname]
                    ops = 2.0 * t * n_in * n_out
                    moved = wbytes + x.numel() * x.element_size() + t * n_out * (4 if xdt == torch.float32 else 2)
                    rows.append({"shape": sname, "in": n_in, "out": n_out, "batch": t, "kernel": kname, "impl": impl,
                                 "ms": sec * 1e3, "repeats": n, "weight_bytes": wbytes, "bytes": moved, "ops": ops,
                                 "GBps": moved / sec / 1e9, "TFLOPps": ops / sec / 1e12})
                bar.update(1)
            del prepared
    rows.sort(key=lambda r: (r["shape"], kernels.index(r["kernel"]), r["batch"]))
    _finish(rows, copy_bw)
    _print(console, rows, copy_bw, dev)
    meta = args_meta(args)
    meta |= {"torch": torch.__version__, "threads": torch.get_num_threads(), "copy_GBps": copy_bw / 1e9,
             "cpu_capability": torch.backends.cpu.get_cpu_capability(), "machine": machine.report()}
    write_csv(args.out / "gemm.csv", rows)
    write_json(args.out / "gemm.json", {"meta": meta, "rows": rows})
    _plot(rows, args.out / "gemm.png")
    console.print(f"wrote {args.out}/gemm.csv, gemm.json, gemm.png")
    return 0


def _finish(rows: list[dict], copy_bw: float) -> None:
    """Speedups against fp32/bf16 of the same shape and batch and against the faster of the two
    (``best_float``: bf16 is native on some CPUs and emulated on others), and the roofline bound."""
    peak = max((r["ops"] / (r["ms"] / 1e3) for r in rows if r["kernel"] in ("fp32", "bf16")), default=0.0)
    base = {(r["shape"], r["batch"], r["kernel"]): r["ms"] for r in rows if r["kernel"] in ("fp32", "bf16")}
    for r in rows:
        bound = max(r["bytes"] / copy_bw, r["ops"] / peak if peak else 0.0)
        r["roofline_ms"] = bound * 1e3
        r["of_roofline"] = bound * 1e3 / r["ms"]
        r["bound_by"] = "memory" if r["bytes"] / copy_bw >= (r["ops"] / peak if peak else 0.0) else "compute"
        for b in ("fp32", "bf16"):
            ref = base.get((r["shape"], r["batch"], b))
            r[f"x_vs_{b}"] = ref / r["ms"] if ref else None
        floats = {b: base[(r["shape"], r["batch"], b)] for b in ("fp32", "bf16") if (r["shape"], r["batch"], b) in base}
        best = min(floats, key=floats.get) if floats else None
        r["best_float"] = best
        r["x_vs_best_float"] = floats[best] / r["ms"] if best else None


def _print(console, rows: list[dict], copy_bw: float, dev) -> None:
    from rich.table import Table

    from .report import fmt_bytes

    from lowbit.native.cpu_features import summary

    table = Table(title=f"linear kernels on {dev if dev.type != 'cpu' else summary()} (median ms; copy bandwidth "
                        f"{copy_bw / 1e9:.1f} GB/s; roofline = max(bytes/copy BW, ops/best F.linear rate))")
    for col in ("shape", "batch", "kernel", "impl", "ms", "vs best float", "vs bf16", "vs fp32", "weights", "GB/s", "TFLOP/s",
                "roofline ms", "of roofline"):
        table.add_column(col, justify="right")
    for r in rows:
        fx = lambda v: "-" if v is None else f"{v:.2f}x"  # noqa: E731
        best = "-" if r["x_vs_best_float"] is None else f"{r['x_vs_best_float']:.2f}x ({r['best_float']})"
        table.add_row(r["shape"], str(r["batch"]), r["kernel"], r["impl"], f"{r['ms']:.3f}", best, fx(r["x_vs_bf16"]),
                      fx(r["x_vs_fp32"]), fmt_bytes(r["weight_bytes"]), f"{r['GBps']:.2f}", f"{r['TFLOPps']:.4f}",
                      f"{r['roofline_ms']:.3f} ({r['bound_by'][0]})", f"{100 * r['of_roofline']:.0f}%")
    console.print(table)


def _plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .report import save_figure

    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    kernels = list(dict.fromkeys(r["kernel"] for r in rows))
    cols = min(4, len(shapes))
    nrows = -(-len(shapes) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4 * cols, 3.2 * nrows), squeeze=False)
    for ax, s in zip(axes.flat, shapes):
        for k in kernels:
            pts = [(r["batch"], r["x_vs_bf16"]) for r in rows if r["shape"] == s and r["kernel"] == k and r["x_vs_bf16"]]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=k)
        ax.axhline(1.0, color="gray", lw=0.8, ls="--")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set_title(s, fontsize=9)
        ax.set_xlabel("batch (tokens)")
        ax.set_ylabel("speed vs bf16 F.linear")
    for ax in list(axes.flat)[len(shapes):]:
        ax.set_visible(False)
    axes.flat[0].legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
