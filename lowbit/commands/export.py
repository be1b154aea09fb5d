"""``lowbit export CHECKPOINT --format compressed-tensors --out DIR``: a lowbit checkpoint as a
folder that vLLM and transformers load (compressed-tensors), or an error naming what the format
cannot hold."""

from __future__ import annotations

import argparse


def register(sub) -> None:
    p = sub.add_parser(
        "export",
        help="write a lowbit checkpoint in another format (compressed-tensors, for vLLM / transformers)",
        description="Export a checkpoint written by `lowbit quantize --out` as a Hugging Face folder in the "
        "compressed-tensors format (config.json with quantization_config, safetensors, tokenizer). W4A16 / W8A16 "
        "(symmetric or not, per group or channel), W8A8 and W4A4 without outliers export; INT8 outlier channels, "
        "FP4 with FP16 scales, groups that do not divide a layer's width and an INT4 KV cache are refused.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("checkpoint", help="a lowbit-quantized checkpoint directory")
    p.add_argument("--format", default="compressed-tensors", choices=["compressed-tensors"], help="target format")
    p.add_argument("--out", required=True, help="new (or empty) output folder")
    p.add_argument("--kv-cache", default="refuse", choices=["refuse", "float"],
                   help="a quantized KV cache cannot be expressed: refuse, or export the weights with a float KV cache")
    p.set_defaults(func=run)


def run(args) -> int:
    import json
    from pathlib import Path

    from rich.console import Console

    from lowbit.errors import UsageError
    from lowbit.export import export_compressed_tensors
    from lowbit.export.writer import check_out_dir
    from lowbit.checkpoint import is_quantized_dir, load_quantized

    console = Console()
    check_out_dir(args.out)  # before any loading: an unusable --out is one line, exit 2 (lowbit.cli)
    if not is_quantized_dir(args.checkpoint):
        raise UsageError(f"{args.checkpoint} is not a lowbit checkpoint (no lowbit_config.json); "
                         "make one with `lowbit quantize MODEL --scheme S --out DIR`")
    model, tok = load_quantized(args.checkpoint)
    out = export_compressed_tensors(model, args.out, tok, kv_cache=args.kv_cache)  # ExportError: one line too
    q = json.loads((Path(out) / "config.json").read_text())["quantization_config"]
    for name, g in q["config_groups"].items():
        w, a = g["weights"], g["input_activations"]
        act = f"A{a['num_bits']} {a['strategy']}" if a else "A16"
        console.print(f"{name}: {g['format']} W{w['num_bits']} {w['strategy']}"
                      f"{'' if not w['group_size'] else w['group_size']} {'sym' if w['symmetric'] else 'asym'} {act}"
                      f" -> {', '.join(g['targets'][:3])}{' ...' if len(g['targets']) > 3 else ''}")
    if q["ignore"]:
        console.print(f"left float: {', '.join(q['ignore'])}")
    act = getattr(getattr(model, "lowbit_scheme", None), "activations", None)
    if act is not None and act.enabled and act.scale_rule == "signed":
        hi = 2 ** (act.bits - 1) - 1
        console.print("note: activations were quantized on lowbit's grid (the signed absmax on code "
                      f"-{hi + 1}); the format has no field for it, and its readers quantize each token on their own "
                      f"(transformers / compressed-tensors: absmax / {hi + 0.5}, vLLM: absmax / {hi}), so they compute "
                      "a slightly different function; for transformers' exactly, quantize with "
                      "--set activations.scale_rule=compressed-tensors")
    size = sum(f.stat().st_size for f in Path(out).iterdir() if f.is_file())
    console.print(f"wrote {out} ({size / 2**20:.1f} MiB)")
    return 0
