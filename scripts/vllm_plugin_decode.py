"""Decode tok/s of vLLM's offline ``LLM.generate`` on the default model: vLLM BF16 against lowbit's
W4A4 and W4A16 checkpoints through the lowbit plugin (and, with ``--formats``, vLLM's own W8A8 and
W4A16 kernels on lowbit's exports beside the plugin on the same checkpoints), one vLLM process,
engines one after the other.

    python scripts/vllm_plugin_decode.py --work DIR [--batches 1 16] [--repeats 3] [--formats ...] [--json OUT]

DIR receives the float folder and the two checkpoints (quantized once, round-to-nearest: the
kernels' speed does not depend on GPTQ); later runs reuse them. Prompts are 128-token WikiText-2
test windows, 64 new tokens, no early stop; decode tok/s = batch x 63 / (time for 64 tokens - time
for 1 token), medians of the repeats; ratios are against vLLM on the float model (``float``) when it
ran (``--formats`` picks engines). All engines run in ``--dtype`` (bf16 by default; float32 is the
faster float where the CPU has no AVX512_BF16 and vLLM's bf16 linears fall back to torch's
``F.linear``), eager (``enforce_eager=True``), or with ``--compiled`` as vLLM serves by default
(its compiled graph; then nothing can time the linears apart and only whole steps are reported). Each
eager decode step is split into vLLM's linear layers (every ``apply``: lowbit's op with its input gather,
vLLM's own GEMMs, the LM head) and the rest (attention, norms, sampling, scheduling), timed the same
way: ms per step = (median time for 64 tokens - median for 1) / 63.
Run it with lowbit's own environment (``.venv/bin/python``: it makes the checkpoints with
lowbit's quantizer, whose KV cache needs transformers >= 5.20); it starts vLLM in the vLLM
environment (``scripts/venv_vllm.sh``; ``LOWBIT_VLLM_PYTHON`` names another).
"""

from __future__ import annotations

import argparse
import copy
import statistics
from pathlib import Path

import torch

PROMPT, NEW = 128, 64
# --formats name: (folder under --work, vllm.LLM's extra arguments). vllm-*: lowbit's checkpoint
# exported to compressed-tensors and run by vLLM's own kernels; plugin-w8a8 / plugin-w4a16g64 serve
# the very checkpoints those exports come from, through the plugin (same weights, other kernels).
ENGINES = {"float": ("float", {}), "w4a4": ("w4a4", {"quantization": "lowbit"}),
           "w4a16": ("w4a16", {"quantization": "lowbit"}),
           "vllm-w8a8": ("export-w8a8/compressed-tensors", {}),
           "plugin-w8a8": ("export-w8a8/lowbit", {"quantization": "lowbit"}),
           "vllm-w4a16g64": ("export-w4a16/compressed-tensors", {}),
           "plugin-w4a16g64": ("export-w4a16/lowbit", {"quantization": "lowbit"})}
DEFAULT = ["float", "w4a4", "w4a16"]


def _checkpoints(work: Path, n_prompts: int):
    from lowbit.bench.vllm_exports import export_for_vllm, quantize_for_vllm
    from lowbit.checkpoint import load_model, save_quantized
    from lowbit.data import calibration_ids
    from lowbit.eval.windows import eval_windows
    from lowbit.formats.scheme import GPTQArgs, WeightArgs
    from lowbit.quantize import get_scheme, quantize_model

    base, tok = load_model("default", dtype=torch.float32)
    rtn = dict(gptq=GPTQArgs(enabled=False), weights=WeightArgs(bits=4, group_size=128, symmetric=True))
    if not (work / "float").exists():
        base.save_pretrained(work / "float")
        tok.save_pretrained(work / "float")
    for fmt in ("w4a4", "w4a16"):
        if not (work / fmt).exists():
            model = copy.deepcopy(base)
            quantize_model(model, get_scheme(fmt).with_(**rtn), calibration_ids(tok, 2, 128))
            save_quantized(model, work / fmt, tok)
    for fmt in ("w8a8", "w4a16"):  # lowbit bench serve's vLLM-servable versions, and their exports
        out = work / f"export-{fmt}"
        if not (out / "compressed-tensors").exists():
            model = quantize_for_vllm(base, fmt, calibration_ids(tok, 2, 128))
            save_quantized(model, out / "lowbit", tok)
            export_for_vllm(model, tok, out / "compressed-tensors")
    prompts = eval_windows(tok, "wikitext2", PROMPT, n_prompts)
    if len(prompts) < n_prompts:  # never a batch silently made of fewer prompts than it says
        raise SystemExit(f"WikiText-2 gives {len(prompts)} prompts of {PROMPT} tokens, fewer than batch {n_prompts}")
    return prompts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--formats", nargs="+", choices=list(ENGINES), default=DEFAULT)
    ap.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16",
                    help="every engine's dtype (float32 is the faster float on CPUs without AVX512_BF16)")
    ap.add_argument("--compiled", action="store_true",
                    help="vLLM's default compiled graph instead of eager (whole steps only: no linears split)")
    args = ap.parse_args()
    from lowbit.bench.vllm_engine import find_python
    from lowbit.io.atomic import write_json
    from lowbit.vllm_plugin.runner import run

    args.work.mkdir(parents=True, exist_ok=True)
    prompts = _checkpoints(args.work, max(args.batches)).tolist()
    engines = {n: ENGINES[n][1] for n in args.formats}
    folders = {n: ENGINES[n][0] for n in args.formats}
    job = {"kind": "decode", "prompts": prompts, "batches": args.batches, "new": NEW, "repeats": args.repeats,
           "split": not args.compiled}
    req = {"engines": [{"llm": {"model": str(args.work / folders[n]), "dtype": args.dtype, "enforce_eager": not args.compiled,
                                "max_model_len": PROMPT + NEW + 8, "max_num_seqs": max(args.batches), **kw},
                        "jobs": [job]} for n, kw in engines.items()]}
    result = run(req, timeout=3000, python=find_python())
    rows = []
    for name, eng in zip(engines, result["engines"]):
        for r in eng["jobs"][0]["rows"]:
            step = statistics.median(r["total_s"]) - statistics.median(r["prefill_s"])
            row = {"format": name, "batch": r["batch"], "decode_tok_s": r["batch"] * (NEW - 1) / step,
                   "step_ms": 1e3 * step / (NEW - 1), **r}
            if not args.compiled:
                lin = statistics.median(r["total_linear_s"]) - statistics.median(r["prefill_linear_s"])
                row.update(linear_ms=1e3 * lin / (NEW - 1), rest_ms=1e3 * (step - lin) / (NEW - 1))
            rows.append(row)
    base = {r["batch"]: r["decode_tok_s"] for r in rows if r["format"] == "float"}
    what = "ms/step" if args.compiled else "ms/step: linears + rest"
    print(f"| format ({args.dtype}, {'compiled' if args.compiled else 'eager'}) | "
          + " | ".join(f"batch {b} tok/s (vs vLLM float); {what}" for b in args.batches) + " |")
    for name in engines:
        cells = [f"{r['decode_tok_s']:.1f} ({r['decode_tok_s'] / base[r['batch']] if base else float('nan'):.2f}x); "
                 + (f"{r['step_ms']:.1f}" if args.compiled else f"{r['linear_ms']:.1f} + {r['rest_ms']:.1f}")
                 for r in rows if r["format"] == name]
        print(f"| {name} | " + " | ".join(cells) + " |")
    if args.json:
        from lowbit.bench.machine import report

        write_json(args.json, {"vllm": result["vllm"], "dtype": args.dtype, "compiled": args.compiled,
                               "machine": report(), "rows": rows})


if __name__ == "__main__":
    main()
