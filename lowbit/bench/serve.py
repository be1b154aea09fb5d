"""``lowbit bench serve``: the default model served by vLLM's OpenAI-compatible server (``vllm
serve``) in each format (BF16, lowbit's W8A8 and W4A16 exports on vLLM's kernels, lowbit's
checkpoints through its vLLM plugin: :mod:`.serve_formats`), under a streaming client at each
concurrency level, next to lowbit's own ``generate`` loop on the same checkpoints and requests
(static batches of the same size; once per checkpoint: ``plugin-w4a16`` shares ``w4a16``'s).
Reported per format, engine and concurrency: output tokens/s, TTFT and inter-token latency
(p50/p99) and the peak resident memory of the serving process tree; as a table, ``serve.json``
and ``serve.png`` (output tokens/s against concurrency, Atom's Figure 10).

Requests are real text (:mod:`.serve_requests`); every level sends a prefix of one seeded list.
vLLM runs from its own environment (:mod:`.vllm_engine` finds it), on 127.0.0.1 and a free port.
A server (or lowbit's loop) that fails is recorded under ``failed`` with its log's tail, the other
formats still run, and the command exits 1 at the end.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from lowbit.bench.report import args_meta

from .serve_formats import FORMATS

ENGINES = ("vllm", "lowbit")


def request_counts(concurrency: list[int], requests: int) -> dict[int, int]:
    """Requests per level: ``requests`` if given, else twice the concurrency (at least 8), never
    fewer than the concurrency (every slot gets one)."""
    return {c: max(c, requests) if requests else max(8, 2 * c) for c in concurrency}


def _formats(spec: str) -> list:
    from lowbit.errors import UsageError

    names = list(dict.fromkeys(f.strip() for f in spec.split(",") if f.strip()))
    bad = [f for f in names if f not in FORMATS]
    if bad or not names:
        raise UsageError(f"--formats {spec}: choose from {', '.join(FORMATS)}")
    return [FORMATS[n] for n in names]


def run(args) -> int:
    """The benchmark, with SIGTERM turned into an exit that runs the servers' ``finally`` (a
    ``timeout`` or ``kill`` of this process then stops their process trees too)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return _run(args)

    def terminate(signum, frame):
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        return _run(args)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run(args) -> int:
    import torch
    from rich.console import Console

    from lowbit.checkpoint import load_model
    from lowbit.data import calibration_ids
    from lowbit.errors import UsageError
    from lowbit.io.outputs import check_output_dir

    from . import machine
    from .report import write_json
    from .serve_engines import VllmServer, lowbit_points, vllm_points
    from .serve_rounds import interleaved_points
    from .serve_formats import Source
    from .serve_requests import build_requests, describe
    from .serve_server import ServerFailed
    from .vllm_engine import find_python, unsupported_reason

    formats = _formats(args.formats)
    levels = args.concurrency.split(",") if isinstance(args.concurrency, str) else args.concurrency
    args.concurrency = list(dict.fromkeys(int(c) for c in levels))
    if args.new_min > args.new_max:
        raise UsageError(f"--new-min {args.new_min} is above --new-max {args.new_max}")
    engines = [e for e in ENGINES if not (e == "lowbit" and args.vllm_only)]
    check_output_dir(args.out, "--out")
    python = find_python()  # before any work: no vLLM is one line naming what to install
    console = Console(width=max(150, Console().width))
    skipped = {f.name: why for f in formats if (why := unsupported_reason(f.name, python))}
    if skipped and args.formats != ",".join(FORMATS):  # asked for by name: an error, before any work
        raise UsageError("; ".join(f"--formats {name}: {why}" for name, why in skipped.items()))
    for name, why in skipped.items():  # the default list: the others still run
        console.print(f"skipping {name}: {why}", highlight=False)
    formats = [f for f in formats if f.name not in skipped]
    base, tok = load_model(args.model, dtype=torch.float32, device="cpu")
    base.eval()
    counts = request_counts(args.concurrency, args.requests)
    reqs = build_requests(tok, max(counts.values()), args.prompt_max, args.new_min, args.new_max, args.seed)
    requests = [r.as_json() for r in reqs]
    n, seqlen = (int(v) for v in args.calib.lower().split("x"))
    source = Source(base, tok, calibration_ids(tok, n, seqlen))
    logs = args.out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    rows, meta_engines, failed = [], {}, {}
    meta = args_meta(args)
    meta |= {"torch": torch.__version__, "vllm_python": python, "engines": meta_engines, "skipped": skipped,
             "failed": failed,
             "requests": describe(reqs), "request_counts": counts, "machine": machine.report(),
             "formats": {f.name: {"about": f.about, "vllm_args": list(f.vllm_args), "vllm_env": f.vllm_env}
                         for f in formats}}
    order = [f.name for f in formats]

    def add(engine: str, fmt, pts: list[dict]) -> None:
        rows.extend({"engine": engine, "format": fmt.name, **p} for p in pts)
        _progress(console, rows[-len(pts):])
        _finish_rows(rows, order)
        write_json(args.out / "serve.json", {"meta": meta | {"complete": False}, "rows": rows})  # so far

    def record_failure(key: str, e: ServerFailed) -> None:
        """A server that failed: its error (the log's tail) into serve.json; the others still run."""
        failed[key] = str(e)
        console.print(f"{key} FAILED (the other formats go on; serve.json has the log's tail): "
                      f"{str(e).splitlines()[0]}", highlight=False)
        write_json(args.out / "serve.json", {"meta": meta | {"complete": False}, "rows": rows})

    def measure(engine: str, fmt, points) -> None:
        """One engine on one format; a server that fails is recorded and the others still run."""
        key = f"{engine}/{fmt.name}"
        try:
            pts, meta_engines[key] = points()
        except ServerFailed as e:
            record_failure(key, e)
            return
        add(engine, fmt, pts)

    def interleaved(ckpts: dict) -> None:
        """``--rounds``: every format's server at once, the levels driven in turn (:mod:`.serve_rounds`)."""
        servers = {f.name: VllmServer(python, f, ckpts[f.name].vllm, requests, counts, args,
                                      logs / f"vllm-{f.name}.log") for f in formats}

        def fail(name: str, e: ServerFailed) -> None:
            record_failure(f"vllm/{name}", e)

        started = {}
        try:
            for name, server in servers.items():
                console.print(f"{name}: vllm serve ({python}), kept up for {args.rounds} rounds", highlight=False)
                try:
                    server.start()
                    started[name] = server
                except ServerFailed as e:
                    fail(name, e)
                    meta_engines[f"vllm/{name}"] = server.stop()
            pts = interleaved_points(started, args.concurrency, args.rounds, fail, lambda name, r, p: console.print(
                f"  round {r + 1}/{args.rounds} vllm {name} concurrency {p['concurrency']}: {p['output_tok_s']:.1f} "
                f"output tok/s, {p['requests']} requests in {p['wall_s']:.1f} s", highlight=False))
        finally:
            for name, server in started.items():
                meta_engines[f"vllm/{name}"] = server.stop()
        for fmt in formats:
            if pts.get(fmt.name):
                add("vllm", fmt, pts[fmt.name])

    looped: dict[Path, str] = {}  # lowbit folder -> the format whose lowbit rows ran on it
    with tempfile.TemporaryDirectory(prefix="lowbit-serve-") as tmp:
        interleave = args.rounds > 1  # every checkpoint first, then every server at once
        ckpts = {f.name: f.make(source, Path(tmp) / f.name) for f in formats} if interleave else {}
        if interleave:
            interleaved(ckpts)
        for fmt in formats:
            ckpt = ckpts[fmt.name] if interleave else fmt.make(source, Path(tmp) / fmt.name)
            if not interleave:
                console.print(f"{fmt.name}: vllm serve ({python})", highlight=False)
                measure("vllm", fmt, lambda: vllm_points(python, fmt, ckpt.vllm, requests, counts, args,
                                                         logs / f"vllm-{fmt.name}.log"))
            if "lowbit" in engines and ckpt.lowbit in looped:  # plugin-w4a16 after w4a16: the same checkpoint
                meta_engines[f"lowbit/{fmt.name}"] = {"same_checkpoint_as": f"lowbit/{looped[ckpt.lowbit]}"}
            elif "lowbit" in engines and ckpt.lowbit is not None:
                looped[ckpt.lowbit] = fmt.name
                console.print(f"{fmt.name}: lowbit's generate loop", highlight=False)
                measure("lowbit", fmt, lambda: lowbit_points(ckpt.lowbit, requests, counts, args,
                                                             logs / f"lowbit-{fmt.name}.log", Path(tmp)))
    console.print(_table(rows, args))
    write_json(args.out / "serve.json", {"meta": meta | {"complete": True}, "rows": rows})
    _plot(rows, args.out / "serve.png")
    console.print(f"wrote {args.out}/serve.json, serve.png (server logs in {logs})")
    if failed:
        console.print(f"failed: {', '.join(failed)} (see meta.failed in serve.json and the logs)", highlight=False)
        return 1
    return 0


def _finish_rows(rows: list[dict], order: list[str]) -> None:
    """Each row's ratio to vLLM BF16 at its concurrency (where measured); rows in table order."""
    ref = {r["concurrency"]: r["output_tok_s"] for r in rows if (r["engine"], r["format"]) == ("vllm", "bf16")}
    for r in rows:
        r["vs_vllm_bf16"] = r["output_tok_s"] / ref[r["concurrency"]] if r["concurrency"] in ref else None
    rows.sort(key=lambda r: (r["concurrency"], ENGINES.index(r["engine"]), order.index(r["format"])))


def _progress(console, rows: list[dict]) -> None:
    for r in rows:
        console.print(f"  {r['engine']} {r['format']} concurrency {r['concurrency']}: {r['output_tok_s']:.1f} "
                      f"output tok/s, {r['requests']} requests in {r['wall_s']:.1f} s", highlight=False)


def _ms(v) -> str:
    return "-" if v is None else f"{v:.0f}" if v >= 100 else f"{v:.1f}"


def _per_step(r: dict, key: str) -> str:
    return "-" if r.get(key) is None else f"{r[key]:.1f}"


def _step_split(r: dict) -> str:
    """ms per engine step, as lowbit's linears + the rest where the op timed itself (plugin formats)."""
    if r.get("step_ms") is None:
        return "-"
    if r.get("linear_ms") is None:
        return _ms(r["step_ms"])
    return f"{_ms(r['step_ms'])}: {_ms(r['linear_ms'])} + {_ms(r['rest_ms'])}"


def _table(rows: list[dict], args):
    from rich.table import Table

    from .report import fmt_bytes

    table = Table(title=f"serve, {args.model}: prompts ≤ {args.prompt_max} tokens of real text, "
                        f"{args.new_min}-{args.new_max} output tokens, seed {args.seed}"
                        f"{', vLLM eager' if args.eager else ''}; lowbit = static batches of the concurrency")
    for c in ("concurrency", "engine", "format", "requests", "output tok/s", "vs vLLM bf16", "TTFT p50 ms",
              "TTFT p99 ms", "ITL p50 ms", "ITL p99 ms", "tokens/step", "ms/step: linears + rest", "peak memory"):
        table.add_column(c, justify="right")
    for r in rows:
        vs = "-" if r["vs_vllm_bf16"] is None else f"{r['vs_vllm_bf16']:.2f}x"
        table.add_row(str(r["concurrency"]), r["engine"], r["format"], str(r["requests"]), f"{r['output_tok_s']:.1f}",
                      vs, _ms(r["ttft_p50_ms"]), _ms(r["ttft_p99_ms"]), _ms(r["itl_p50_ms"]), _ms(r["itl_p99_ms"]),
                      _per_step(r, "tokens_per_step"), _step_split(r), fmt_bytes(r["peak_rss_bytes"]))
    return table


def _plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .report import save_figure

    fig, ax = plt.subplots(figsize=(6, 4))
    for key in dict.fromkeys((r["engine"], r["format"]) for r in rows):
        pts = sorted((r["concurrency"], r["output_tok_s"]) for r in rows if (r["engine"], r["format"]) == key)
        ax.plot(*zip(*pts), marker="o", linestyle="-" if key[0] == "vllm" else "--", label=" ".join(key))
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrent requests (lowbit: batch size)")
    ax.set_ylabel("output tokens/s")
    ax.set_title("throughput against concurrency")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    save_figure(fig, path)
    plt.close(fig)
