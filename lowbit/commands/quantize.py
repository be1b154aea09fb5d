"""``lowbit quantize MODEL --scheme NAME --out DIR``: quantize layer by layer, save packed,
print float against quantized (WikiText-2 perplexity, KL, weight bytes)."""

from __future__ import annotations

import argparse

from .argtypes import nonneg_int, positive_int


def register(sub) -> None:
    from lowbit.quantize.presets import PRESETS

    p = sub.add_parser(
        "quantize",
        help="quantize a Llama-like model (Atom-style W4A4 and baselines), save it packed",
        description="Calibrate on WikiText-2 validation windows one decoder layer at a time, quantize with "
        "a named scheme, optionally save the packed checkpoint, and compare against the float model.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("model", nargs="?", default="default", help="'default' (SmolLM2-135M-Instruct), a HF id or a directory")
    p.add_argument("--scheme", default="w4a4-kv4", choices=sorted(PRESETS), help="preset scheme")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="PART.FIELD=VALUE",
                   help="override a scheme field, e.g. outliers.count=64 (repeatable)")
    p.add_argument("--name", help="name of the resulting scheme (default: preset + overrides)")
    p.add_argument("--tp", type=positive_int, default=1, metavar="W",
                   help="quantize for W tensor-parallel ranks: o_proj/down_proj get outliers, groups and GPTQ local to "
                   "each rank's input slice, so `lowbit eval --tp W` and vLLM (`--quantization lowbit "
                   "--tensor-parallel-size W`) can run the checkpoint sharded")
    p.add_argument("--from-disk", action="store_true",
                   help="keep the decoder layers on disk and load one at a time (peak memory: embeddings + one float "
                   "layer + the quantized layers), for models larger than memory; needs a safetensors folder")
    p.add_argument("--out", help="write the quantized checkpoint here (safetensors + lowbit_config.json)")
    p.add_argument("--samples", type=positive_int, default=128, help="calibration sequences (Atom: 128; use ~16 on a CPU)")
    p.add_argument("--seqlen", type=positive_int, default=2048, help="tokens per calibration sequence (Atom: 2048)")
    p.add_argument("--device", default="cpu", help="where calibration, GPTQ and the comparison run: cpu, cuda or cuda:N")
    p.add_argument("--threads", type=positive_int, help="torch CPU threads")
    p.add_argument("--eval-windows", type=nonneg_int, default=40, help="WikiText-2 test windows to compare on (0: skip)")
    p.add_argument("--eval-seqlen", type=positive_int, default=512, help="tokens per evaluation window")
    p.add_argument("--reference", metavar="PATH", help="cache of the float model's top-k log-probs (made if missing); "
                   "KL is then the top-k lower bound")
    p.add_argument("--json", metavar="PATH", help="append the result as one JSON line")
    p.set_defaults(func=run)


def _checked_scheme(args):
    """Everything that can be wrong with the arguments, found before the model is loaded."""
    from pathlib import Path

    import torch

    from lowbit.data.calibration import DEFAULT_CALIBRATION
    from lowbit.data.eval_text import eval_path
    from lowbit.data.paths import data_file
    from lowbit.errors import UsageError
    from lowbit.checkpoint import check_save_target, is_quantized_dir
    from lowbit.io.outputs import check_output_file
    from lowbit.models.loading import DEFAULT_NAMES, resolve
    from lowbit.quantize import TPArgs, get_scheme
    from lowbit.quantize.overrides import apply_overrides

    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"--device {args.device} but torch sees no CUDA device")
    scheme = apply_overrides(get_scheme(args.scheme), args.overrides, args.name)
    if args.tp != 1:
        scheme = scheme.with_(name=args.name or f"{scheme.name}-tp{args.tp}", tensor_parallel=TPArgs(world=args.tp))
    if args.out:
        check_save_target(args.out)
    check_output_file(args.json, "--json")
    if args.reference and not Path(args.reference).is_file():
        check_output_file(args.reference, "--reference")
    data_file(DEFAULT_CALIBRATION)
    if args.eval_windows:
        eval_path("wikitext2")
    if args.model not in DEFAULT_NAMES:
        from transformers import AutoConfig

        from lowbit.models.adapters import check_supported

        path = resolve(args.model)
        if is_quantized_dir(path):
            raise UsageError(f"{args.model} is already a lowbit-quantized checkpoint; quantize its float original")
        check_supported(AutoConfig.from_pretrained(path).model_type)
    return scheme


def run(args) -> int:
    import json
    import time

    import torch
    from rich.console import Console
    from rich.table import Table

    from lowbit.data import calibration_ids
    from lowbit.io.atomic import append_line
    from lowbit.checkpoint import load_model
    from lowbit.models.adapters import get_adapter
    from lowbit.quantize import quantize_model
    from lowbit.quantize.weight_bytes import decoder_bytes

    scheme = _checked_scheme(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    console = Console()
    t0 = time.perf_counter()
    load_layer = None
    if args.from_disk:
        from lowbit.models.lazy import open_from_disk
        from lowbit.models.loading import load_tokenizer, resolve

        model, load_layer = open_from_disk(resolve(args.model))
        tok = load_tokenizer(args.model)
    else:
        model, tok = load_model(args.model)
    get_adapter(model)  # an unsupported architecture fails here, before calibration
    float_bytes = decoder_bytes(model)
    ids = calibration_ids(tok, args.samples, args.seqlen)
    console.print(f"[bold]{scheme.name}[/]: calibrating on {args.samples} x {args.seqlen} tokens of WikiText-2 validation")
    rep = quantize_model(model, scheme, ids, device=args.device, load_layer=load_layer)  # returns the model on the CPU
    q_bytes = decoder_bytes(model)
    result = {"model": args.model, "scheme": scheme.to_dict(), "samples": args.samples, "seqlen": args.seqlen,
              "quantize_seconds": round(rep.seconds, 1), "decoder_bytes_float": float_bytes, "decoder_bytes_quantized": q_bytes}
    if args.out:
        from lowbit.checkpoint import save_quantized

        save_quantized(model, args.out, tok, extra={"calibration": {"samples": args.samples, "seqlen": args.seqlen}})
        console.print(f"saved to {args.out}")
    if args.eval_windows:
        from lowbit.eval.float_comparison import compare_to_float, float_reference

        model.to(args.device)
        window = dict(seqlen=args.eval_seqlen, max_windows=args.eval_windows)
        ref = float_reference(args.reference, lambda: load_model(args.model, device=args.device)[0], tok, **window)
        result.update(compare_to_float(ref, model, tok, **window))
    result["wall_seconds"] = round(time.perf_counter() - t0, 1)
    table = Table(title=f"{args.model}: float vs {scheme.name}")
    table.add_column("")
    table.add_column("float", justify="right")
    table.add_column(scheme.name, justify="right")
    if "ppl" in result:
        table.add_row(f"WikiText-2 ppl ({result['eval_windows']} x {args.eval_seqlen})", f"{result['ref_ppl']:.3f}",
                      f"{result['ppl']:.3f} ({result['ratio']:.3f}x)")
        table.add_row(f"KL to float ({result['kl_method']})", "0", f"{result['mean_kl']:.4f}")
        table.add_row("top-1 agreement", "1", f"{result['top1_agreement']:.3f}")
    table.add_row("decoder weight bytes", f"{float_bytes:,}", f"{q_bytes:,} ({float_bytes / q_bytes:.2f}x smaller)")
    table.add_row("quantize time (s)", "", f"{rep.seconds:.0f}")
    console.print(table)
    if args.json:
        append_line(args.json, json.dumps(result))
    return 0
