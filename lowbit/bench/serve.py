"""``lowbit bench serve``: vLLM's offline generation tokens/s of the real model (BF16, and
lowbit's W8A8 and W4A16 exports) per batch size, next to lowbit's own decode loop (the one
``lowbit bench decode`` times) on the same checkpoints, in one run on one machine.

vLLM runs in a subprocess (:mod:`.vllm_engine`), one engine per format, in the vLLM
environment when lowbit's own lacks vLLM. Both engines generate ``--new`` tokens after the same
``--prompt``-token prompts with no early stop; tok/s = batch x new / wall time of the whole call
(prefill included), median of ``--repeats``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from lowbit.bench.report import args_meta

FORMATS = ("bf16", "w8a8", "w4a16")


def _lowbit_model(base, quantized, fmt: str, kernel, native: bool):
    """lowbit's decode-ready model: the kernels swapped in as ``bench decode`` does."""
    import copy

    import torch

    from lowbit.accelerate import accelerate
    from lowbit.accelerate.native_ops import use_native_ops

    if quantized is None:  # bf16
        model = copy.deepcopy(base)
        if native:
            dict(use_native_ops(model))
        return model.to(torch.bfloat16).eval()
    model = quantized
    counts = dict(accelerate(model, kernel))
    if native:
        dict(use_native_ops(model))
    if model.lowbit_scheme.activations.bits >= 16 and not counts.get("kept_reference"):
        model.to(dtype=torch.bfloat16)  # weight-only: the rest in bf16, as in the BF16 baseline
    return model.eval()


def _time_lowbit(model, prompts, batches, new, repeats, pad) -> list[dict]:
    import statistics
    import time

    import torch
    from transformers import DynamicCache

    rows = []
    for b in batches:
        ids = prompts[:b]

        def gen(n, ids=ids):
            with torch.inference_mode():
                model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                               min_new_tokens=n, do_sample=False, cache=DynamicCache(config=model.config),
                               pad_token_id=pad)

        gen(2)  # warm-up
        secs = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            gen(new)
            secs.append(time.perf_counter() - t0)
        rows.append({"batch": b, "seconds": secs, "tokens": b * new, "median_s": statistics.median(secs)})
    return rows


def _time_vllm(folder: Path, prompts, args) -> tuple[list[dict], dict]:
    import statistics

    from .vllm_engine import run_worker

    req = {"model": str(folder), "dtype": "bfloat16", "max_model_len": args.prompt + args.new + 8,
           "max_num_seqs": max(args.batches), "compile": not args.eager, "threads": args.threads or None,
           "jobs": [{"kind": "throughput", "prompts": prompts.tolist(), "batches": list(args.batches),
                     "new": args.new, "repeats": args.repeats}]}
    res = run_worker(req, timeout=args.timeout)
    rows = res["jobs"][0]["rows"]
    for r in rows:
        r["median_s"] = statistics.median(r["seconds"])
    return rows, {"vllm": res["vllm"], "load_s": res["load_s"]}


def run(args) -> int:
    import torch
    from rich.console import Console
    from rich.table import Table

    from lowbit.checkpoint import load_model
    from lowbit.data import calibration_ids
    from lowbit.errors import UsageError
    from lowbit.io.outputs import check_output_dir

    from . import machine
    from .report import write_json
    from .vllm_engine import find_python
    from .vllm_exports import export_for_vllm, quantize_for_vllm

    formats = list(dict.fromkeys(["bf16"] + [f.strip() for f in args.formats.split(",") if f.strip()]))
    bad = [f for f in formats if f not in FORMATS]
    if bad:
        raise UsageError(f"--formats {','.join(bad)}: vLLM serves {', '.join(FORMATS)} of lowbit's formats")
    if args.new < 2:
        raise UsageError("--new must be >= 2")
    check_output_dir(args.out, "--out")
    python = find_python()  # before any work: no vLLM is one line naming what to install
    console = Console(width=max(120, Console().width))
    if args.threads:
        torch.set_num_threads(args.threads)
    base, tok = load_model(args.model, dtype=torch.float32, device="cpu")
    base.eval()
    prompts = calibration_ids(tok, max(args.batches), args.prompt, seed=1)
    n, seqlen = (int(v) for v in args.calib.lower().split("x"))
    calib = calibration_ids(tok, n, seqlen)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    rows, vllm_meta = [], {}
    with tempfile.TemporaryDirectory(prefix="lowbit-serve-") as tmp:
        for fmt in formats:
            quantized, folder = None, Path(tmp) / fmt
            if fmt == "bf16":
                base.save_pretrained(folder)  # fp32; vLLM casts it to bf16 as it loads
                tok.save_pretrained(folder)
            else:
                quantized = quantize_for_vllm(base, fmt, calib)
                export_for_vllm(quantized, tok, folder)
            console.print(f"{fmt}: vLLM ({python})", highlight=False)
            vrows, vllm_meta[fmt] = _time_vllm(folder, prompts, args)
            console.print(f"{fmt}: lowbit", highlight=False)
            model = _lowbit_model(base, quantized, fmt, args.kernel, not args.stock_ops)
            lrows = _time_lowbit(model, prompts, args.batches, args.new, args.repeats, pad)
            del model, quantized
            for engine, rs in (("vllm", vrows), ("lowbit", lrows)):
                for r in rs:
                    rows.append({"engine": engine, "format": fmt, "batch": r["batch"], "prompt": args.prompt,
                                 "new": args.new, "repeats": args.repeats, "seconds": r["seconds"],
                                 "gen_tok_s": r["tokens"] / r["median_s"]})
    ref = {r["batch"]: r["gen_tok_s"] for r in rows if r["engine"] == "vllm" and r["format"] == "bf16"}
    for r in rows:
        r["vs_vllm_bf16"] = r["gen_tok_s"] / ref[r["batch"]]
    rows.sort(key=lambda r: (r["batch"], r["engine"], formats.index(r["format"])))
    table = Table(title=f"serve, {args.model}, prompt {args.prompt} + {args.new} new tokens, "
                        f"median of {args.repeats}, generation tok/s (prefill included)"
                        f"{', vLLM eager' if args.eager else ''}")
    for c in ("batch", "engine", "format", "gen tok/s", "vs vLLM bf16"):
        table.add_column(c, justify="right")
    for r in rows:
        table.add_row(str(r["batch"]), r["engine"], r["format"], f"{r['gen_tok_s']:.1f}", f"{r['vs_vllm_bf16']:.2f}x")
    console.print(table)
    meta = args_meta(args)
    meta |= {"torch": torch.__version__, "threads": torch.get_num_threads(), "vllm_python": python,
             "vllm": vllm_meta, "machine": machine.report()}
    write_json(args.out / "serve.json", {"meta": meta, "rows": rows})
    _plot(rows, args.out / "serve.png")
    console.print(f"wrote {args.out}/serve.json, serve.png")
    return 0


def _plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .report import save_figure

    fig, ax = plt.subplots(figsize=(6, 4))
    for key in dict.fromkeys((r["engine"], r["format"]) for r in rows):
        pts = sorted((r["batch"], r["gen_tok_s"]) for r in rows if (r["engine"], r["format"]) == key)
        ax.plot(*zip(*pts), marker="o", linestyle="-" if key[0] == "vllm" else "--", label=" ".join(key))
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("batch (sequences)")
    ax.set_ylabel("generation tokens/s")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    save_figure(fig, path)
    plt.close(fig)
