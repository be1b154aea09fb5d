"""``lowbit bench decode-split``: where one decode step's time goes, per format: the decoder's
linears, the LM head, and everything else (attention, norms, rotary, cache updates, sampling,
Python). It says how much a faster linear kernel can still buy: with free decoder linears a
format's step could shrink at most to "LM head + rest".

Timing hooks on every linear (a few µs each, in every format alike); formats are built as
``lowbit bench decode`` builds them, and measured alternately, median of repeats.
"""

from __future__ import annotations

from lowbit.bench.report import args_meta



def _hooks(model, acc: dict) -> list:
    """Accumulate seconds spent in each linear: ``lm_head`` or ``decoder linears``."""
    import time

    import torch

    from lowbit.accelerate.fuse import FusedPart
    from lowbit.accelerate.linears import KernelLinear
    from lowbit.nn.quant_linear import QuantLinear

    handles = []
    for name, mod in model.named_modules():
        if isinstance(mod, (torch.nn.Linear, KernelLinear, QuantLinear, FusedPart)):
            key = "lm_head" if name.endswith("lm_head") else "linears"

            def pre(m, args):
                m._lowbit_t0 = time.perf_counter()

            def post(m, args, out, key=key):
                acc[key] += time.perf_counter() - m._lowbit_t0

            handles += [mod.register_forward_pre_hook(pre), mod.register_forward_hook(post)]
    return handles


def run(args) -> int:
    import statistics
    import time
    from collections import defaultdict

    import torch
    from rich.console import Console
    from rich.table import Table

    from lowbit.data import calibration_ids
    from lowbit.errors import UsageError
    from lowbit.io.outputs import check_output_dir
    from lowbit.checkpoint import load_model

    from .decode import FORMATS, _cache_for, _make_model
    from .report import write_json

    console = Console()
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    bad = [f for f in formats if f not in FORMATS]
    if bad or not formats or args.new < 2:
        raise UsageError(f"--formats {args.formats!r}: choose from {', '.join(FORMATS)}" if bad or not formats else "--new must be >= 2")
    check_output_dir(args.out, "--out")
    if args.threads:
        torch.set_num_threads(args.threads)
    base, tok = load_model(args.model, dtype=torch.float32, device="cpu")
    base.eval()
    ids = calibration_ids(tok, args.batch, args.prompt, seed=1)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    models = {f: _make_model(base, f, tok, args, torch.device("cpu"))[0].eval() for f in formats}

    def gen(model, fmt, n):
        with torch.inference_mode():
            model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                           do_sample=False, cache=_cache_for(model, fmt), pad_token_id=pad)

    samples = defaultdict(list)
    for _ in range(args.repeats):
        for fmt, model in models.items():  # alternate formats: drifts of a shared machine hit both
            gen(model, fmt, 2)
            acc: dict = defaultdict(float)
            handles = _hooks(model, acc)
            try:
                t0 = time.perf_counter()
                gen(model, fmt, 1)
                pre, pre_acc = time.perf_counter() - t0, dict(acc)
                acc.clear()
                t0 = time.perf_counter()
                gen(model, fmt, args.new + 1)
                total = time.perf_counter() - t0
            finally:
                for h in handles:
                    h.remove()
            n = args.new  # steps after the prefill, whose share is subtracted
            step = (total - pre) / n
            lin = (acc["linears"] - pre_acc.get("linears", 0.0)) / n
            head = (acc["lm_head"] - pre_acc.get("lm_head", 0.0)) / n
            samples[fmt].append({"step_ms": step * 1e3, "linears_ms": lin * 1e3, "lm_head_ms": head * 1e3,
                                 "rest_ms": (step - lin - head) * 1e3})
    rows = []
    for fmt in formats:
        med = {k: statistics.median(s[k] for s in samples[fmt]) for k in samples[fmt][0]}
        rows.append({"format": fmt, **med, "bound_ms": med["step_ms"] - med["linears_ms"]})
    ref = rows[0]["step_ms"]
    table = Table(title=f"decode step split, batch {args.batch}, prompt {args.prompt}, {args.new} steps, "
                        f"median of {args.repeats}, {'stock' if args.stock_ops else 'native'} norms/rotary/attention; "
                        f"vs = {formats[0]}'s step / this step")
    for c in ("format", "step ms", "decoder linears ms", "LM head ms", "rest ms", f"vs {formats[0]}",
              "at most, with free linears"):
        table.add_column(c, justify="right")
    for r in rows:
        r["vs_first"], r["vs_first_bound"] = ref / r["step_ms"], ref / r["bound_ms"]
        table.add_row(r["format"], f"{r['step_ms']:.1f}", f"{r['linears_ms']:.1f}", f"{r['lm_head_ms']:.1f}",
                      f"{r['rest_ms']:.1f}", f"{r['vs_first']:.2f}x", f"{r['vs_first_bound']:.2f}x")
    console.print(table)
    meta = args_meta(args)
    write_json(args.out / "decode_split.json", {"meta": meta | {"threads": torch.get_num_threads()},
                                                "rows": rows, "samples": samples})
    console.print(f"wrote {args.out}/decode_split.json")
    return 0
