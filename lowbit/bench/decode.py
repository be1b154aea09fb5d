"""``lowbit bench decode``: generation tokens/s of the real model per format (FP32, BF16, W8A8,
W4A16, W4A4, W4A4 + INT4 KV cache, and their block-Hadamard ``-rot`` presets) and batch size, with peak memory and the bytes of weights and
KV cache, all formats measured in one run: every format is built first, then the formats take
turns within each repeat (a drift of a shared machine hits all of them), median of repeats. Peak
memory (process RSS, or CUDA max allocated) therefore includes every format's resident model.

Quantized linears run through :mod:`lowbit.kernels` (``accelerate`` swaps them in). On CPU every
format, the float baselines included, runs its norms, rotary embedding and one-token attention
through lowbit's native decode ops (:mod:`lowbit.accelerate.native_ops`; ``--stock-ops`` keeps
PyTorch's), so the formats differ only in their linears. Weights are quantized with a tiny
calibration set and RTN by default (``--gptq`` for the presets' GPTQ): speed does not depend on
the weight values, only on the layout, which is the same.
"""

from __future__ import annotations

from pathlib import Path

from lowbit.bench.report import args_meta


FORMATS = ("fp32", "bf16", "w8a8", "w4a16", "w4a4", "w4a4-kv4", "w4a4-rot", "w4a4-kv4-rot")
DEFAULT_FORMATS = FORMATS[:6]  # the -rot presets on request (their online transforms: README)


class PeakRSS:
    """Samples the process RSS in a thread (CPU has no allocator peak counter)."""

    def __init__(self, interval: float = 0.005):
        import psutil

        self.proc, self.interval, self.peak = psutil.Process(), interval, 0

    def __enter__(self):
        import threading

        self.base = self.peak = self.proc.memory_info().rss
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._loop, daemon=True)
        self._t.start()
        return self

    def _loop(self):
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, self.proc.memory_info().rss)

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, self.proc.memory_info().rss)


def kv_bytes(cache) -> int:
    if hasattr(cache, "nbytes"):
        return int(cache.nbytes())
    total = 0
    for layer in cache.layers:
        for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if t is not None and hasattr(t, "numel"):
                total += t.numel() * t.element_size()
    return total


def _make_model(base, fmt: str, tokenizer, args, device):
    """A copy of ``base`` in format ``fmt``: (model, stored decoder weight bytes, kernel counts, quantize s)."""
    import copy
    import time

    import torch

    from lowbit.data import calibration_ids
    from lowbit.accelerate import accelerate
    from lowbit.accelerate.native_ops import use_native_ops
    from lowbit.nn.quant_linear import module_bytes
    from lowbit.quantize import get_scheme, quantize_model
    from lowbit.formats.scheme import GPTQArgs

    model = copy.deepcopy(base)
    layers = model.model.layers
    native = not getattr(args, "stock_ops", False) and device.type == "cpu"
    if fmt in ("fp32", "bf16"):
        ops = dict(use_native_ops(model)) if native else {}
        model.to(device=device, dtype=torch.float32 if fmt == "fp32" else torch.bfloat16)
        return model, module_bytes(layers), ops, 0.0
    scheme = get_scheme(fmt)
    if not args.gptq:
        scheme = scheme.with_(gptq=GPTQArgs(enabled=False))
    n, seqlen = (int(v) for v in args.calib.lower().split("x"))
    t0 = time.perf_counter()
    quantize_model(model, scheme, calibration_ids(tokenizer, n, seqlen), device=str(device), progress=False)
    qs = time.perf_counter() - t0
    stored = module_bytes(layers)
    counts = dict(accelerate(model, args.kernel))
    counts |= dict(use_native_ops(model)) if native else {}
    model.to(device)
    if runs_in_bf16(counts):
        model.to(dtype=torch.bfloat16)
    return model, stored, counts, qs


def runs_in_bf16(counts: dict) -> bool:
    """Whether a quantized model runs inside bf16, as serving engines run W8A8 and W4A16 (vLLM's
    ``dtype``): everything that is not a quantized linear (embeddings, the LM head, norms,
    attention, KV cache) then runs in bf16 exactly as in the BF16 baseline, and the kernels take
    bf16 activations (A8/A4: codes of the bf16 values) and return bf16. Not where a linear kept the
    reference forward (``kept_reference``), which computes in float32. Until stop 37 the A8/A4
    formats ran the rest in float32, which cost them an fp32 LM head (2.5x bf16's at 32 sequences)."""
    return not counts.get("kept_reference")


def _cache_for(model, fmt: str):
    from transformers import DynamicCache

    from lowbit.nn.kv_cache import PackedKVCache
    from lowbit.quantize import get_scheme

    scheme = None if fmt in ("fp32", "bf16") else get_scheme(fmt)
    if scheme is not None and scheme.kv_cache.enabled:  # the preset's cache (INT4, asymmetric, Hadamard-rotated heads)
        return PackedKVCache.for_scheme(model.config, scheme.kv_cache)
    return DynamicCache(config=model.config)


def run(args) -> int:
    import statistics
    import time

    import torch
    from rich.console import Console
    from rich.table import Table
    from tqdm.auto import tqdm

    from lowbit.data import calibration_ids
    from lowbit.errors import UsageError
    from lowbit.io.outputs import check_output_dir
    from lowbit.checkpoint import load_model

    from . import machine
    from .report import fmt_bytes, write_csv, write_json

    console = Console(width=max(140, Console().width))
    # the float baselines always run: each format is judged against the faster of the two here
    formats = list(dict.fromkeys(["fp32", "bf16"] + [f.strip() for f in args.formats.split(",") if f.strip()]))
    bad = [f for f in formats if f not in FORMATS]
    batches = [int(b) for b in args.batches.split(",")]
    if bad or args.new < 2:
        raise UsageError(f"--formats {','.join(bad)}: choose from {', '.join(FORMATS)}" if bad else "--new must be >= 2")
    check_output_dir(args.out, "--out")
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
    base, tok = load_model(args.model, dtype=torch.float32, device="cpu")
    base.eval()
    prompts = calibration_ids(tok, max(batches), args.prompt, seed=1)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    fp16_layer_bytes = sum(p.numel() for p in base.model.layers.parameters()) * 2
    built = {}
    for fmt in tqdm(formats, desc="build formats", disable=None):
        model, stored, counts, qsec = _make_model(base, fmt, tok, args, device)
        built[fmt] = (model.eval(), stored, counts, qsec)
    rows = []
    for b in batches:
        ids = prompts[:b].to(device)

        def gen(fmt: str, n_new: int, ids=ids):
            model = built[fmt][0]
            cache = _cache_for(model, fmt)
            with torch.inference_mode():
                model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=n_new,
                               min_new_tokens=n_new, do_sample=False, cache=cache, pad_token_id=pad)
            sync()
            return cache

        t_pre, t_all, peaks, growth, caches = ({f: [] for f in formats} for _ in range(5))
        for fmt in formats:
            gen(fmt, 2)  # warm-up
        # formats alternate within each repeat, so a drift of a shared machine hits all of them
        for _ in tqdm(range(args.repeats), desc=f"batch {b}", disable=None):
            for fmt in formats:
                if cuda:
                    torch.cuda.reset_peak_memory_stats(device)
                with PeakRSS() as mem:
                    t0 = time.perf_counter()
                    gen(fmt, 1)
                    t_pre[fmt].append(time.perf_counter() - t0)
                    t0 = time.perf_counter()
                    caches[fmt] = gen(fmt, args.new)
                    t_all[fmt].append(time.perf_counter() - t0)
                peaks[fmt].append(torch.cuda.max_memory_allocated(device) if cuda else mem.peak)
                growth[fmt].append(0 if cuda else mem.peak - mem.base)
        for fmt in formats:
            _, stored, counts, qsec = built[fmt]
            pre, tot = statistics.median(t_pre[fmt]), statistics.median(t_all[fmt])
            rows.append({
                "format": fmt, "batch": b, "prompt": args.prompt, "new": args.new, "repeats": args.repeats,
                "gen_tok_s": b * args.new / tot, "decode_tok_s": b * (args.new - 1) / max(tot - pre, 1e-9),
                "prefill_s": pre, "total_s": tot, "peak_mem_bytes": max(peaks[fmt]),
                "peak_mem_kind": "cuda max allocated" if cuda else "process RSS",
                "rss_growth_bytes": max(growth[fmt]),
                "layer_weight_bytes": stored, "layer_weight_vs_fp16": stored / fp16_layer_bytes,
                "kv_bytes": kv_bytes(caches[fmt]), "kernels": counts, "quantize_s": qsec,
            })
            console.print(f"{fmt} batch {b}: {rows[-1]['decode_tok_s']:.1f} decode tok/s, prefill {pre:.2f} s",
                          highlight=False)
    rows.sort(key=lambda r: (formats.index(r["format"]), r["batch"]))
    fp_kv = {r["batch"]: r["kv_bytes"] for r in rows if r["format"] == "fp32"}
    base_tps = {r["batch"]: r["decode_tok_s"] for r in rows if r["format"] == "bf16"}
    best = {}  # per batch, the faster float format (bf16 is native on some CPUs, emulated on others)
    for r in rows:
        if r["format"] in ("fp32", "bf16") and r["decode_tok_s"] > best.get(r["batch"], {}).get("decode_tok_s", 0):
            best[r["batch"]] = r
    for r in rows:
        # FP16's KV = half of FP32's (same shapes), the yardstick
        r["kv_vs_fp16"] = r["kv_bytes"] / (fp_kv[r["batch"]] / 2) if r["batch"] in fp_kv else None
        r["decode_vs_bf16"] = r["decode_tok_s"] / base_tps[r["batch"]] if r["batch"] in base_tps else None
        b = best.get(r["batch"])
        r["best_float"] = b["format"] if b else None
        r["decode_vs_best_float"] = r["decode_tok_s"] / b["decode_tok_s"] if b else None
        r["prefill_vs_best_float"] = b["prefill_s"] / r["prefill_s"] if b and r["prefill_s"] > 0 else None
    table = Table(title=f"decode, {args.model}, prompt {args.prompt} + {args.new} new tokens, {device}, "
                        f"{torch.get_num_threads()} threads, median of {args.repeats}, "
                        f"{'stock' if args.stock_ops or cuda else 'native'} norms/rotary/attention")
    for c in ("format", "batch", "gen tok/s", "decode tok/s", "vs best float", "vs bf16", "prefill s", "prefill vs best", "peak mem",
              "layer weights", "vs fp16", "KV cache", "KV vs fp16"):
        table.add_column(c, justify="right")
    for r in rows:
        fx = lambda v: "-" if v is None else f"{v:.2f}x"  # noqa: E731
        best_s = "-" if r["decode_vs_best_float"] is None else f"{r['decode_vs_best_float']:.2f}x ({r['best_float']})"
        table.add_row(r["format"], str(r["batch"]), f"{r['gen_tok_s']:.1f}", f"{r['decode_tok_s']:.1f}", best_s,
                      fx(r["decode_vs_bf16"]), f"{r['prefill_s']:.2f}", fx(r["prefill_vs_best_float"]),
                      fmt_bytes(r["peak_mem_bytes"]),
                      fmt_bytes(r["layer_weight_bytes"]), fx(r["layer_weight_vs_fp16"]), fmt_bytes(r["kv_bytes"]),
                      fx(r["kv_vs_fp16"]))
    console.print(table)
    meta = args_meta(args)
    meta |= {"torch": torch.__version__, "threads": torch.get_num_threads(), "fp16_layer_bytes": fp16_layer_bytes,
             "machine": machine.report()}
    write_csv(args.out / "decode.csv", [{k: v for k, v in r.items() if k != "kernels"} for r in rows])
    write_json(args.out / "decode.json", {"meta": meta, "rows": rows})
    _plot(rows, args.out / "decode.png")
    console.print(f"wrote {args.out}/decode.csv, decode.json, decode.png")
    return 0


def _plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .report import save_figure

    fig, ax = plt.subplots(figsize=(6, 4))
    for f in dict.fromkeys(r["format"] for r in rows):
        pts = [(r["batch"], r["decode_tok_s"]) for r in rows if r["format"] == f]
        ax.plot(*zip(*pts), marker="o", label=f)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("batch (sequences)")
    ax.set_ylabel("decode tokens/s")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    save_figure(fig, path)
    plt.close(fig)
