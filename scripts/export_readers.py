"""The README's export table: one lowbit checkpoint per scheme, exported to compressed-tensors, and its
WikiText-2 perplexity as computed by each reader of the same folder:

    python scripts/export_readers.py --work DIR [--windows 8] [--seqlen 512] [--no-vllm] [--json OUT]

lowbit's own evaluation of the checkpoint (its reference forward, and its kernels), the reference
with the embeddings nudged by 1e-7 relative noise (how far last-bit differences alone move the
perplexity), transformers' ``from_pretrained`` on the export (fp32), lowbit importing the export
(``load_model``: kernels), and vLLM's ``prompt_logprobs`` on it (bf16, eager; needs
``scripts/venv_vllm.sh``). Schemes: W4A16 RTN g64 with a float head, the ``w8a8``
preset (SmoothQuant 0.5) on lowbit's activation grid, and the same on compressed-tensors' grid
(``activations.scale_rule=compressed-tensors``), the one transformers computes.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from pathlib import Path

import torch

SCHEMES = {
    "w4a16-g64-rtn": ("w4a16", ["weights.group_size=64", "gptq.enabled=false", "gptq.act_order=false",
                                "lm_head.bits=16"]),
    "w8a8": ("w8a8", []),
    "w8a8-ct-rule": ("w8a8", ["activations.scale_rule=compressed-tensors"]),
}


def _ppl(model, windows: torch.Tensor) -> float:
    from lowbit.eval.perplexity import window_perplexity

    return window_perplexity(model, windows)


def _nudged(model, rel: float = 1e-7):
    """``model`` with its input embeddings times (1 + rel·N(0, 1)): last-bit changes, to show how far
    such noise alone moves a quantized model's perplexity (what any two implementations differ by)."""
    e = model.get_input_embeddings().weight
    with torch.no_grad():
        e.mul_(1 + rel * torch.randn(e.shape, generator=torch.Generator().manual_seed(0)))
    return model


def _transformers(auto, folder: Path, windows: torch.Tensor):
    """transformers' model of the export, decompressed (it decompresses in its first whole forward;
    the perplexity loop calls the body and the head apart)."""
    hf = auto.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.inference_mode():
        hf(windows[:1, :8])
    return hf


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, required=True, help="receives each checkpoint and its export")
    ap.add_argument("--schemes", default=",".join(SCHEMES), help="comma list of " + ", ".join(SCHEMES))
    ap.add_argument("--calib", default="4x512", help="calibration SAMPLESxSEQLEN (WikiText-2 train)")
    ap.add_argument("--windows", type=int, default=8, help="WikiText-2 test windows")
    ap.add_argument("--seqlen", type=int, default=512)
    ap.add_argument("--no-vllm", action="store_true", help="skip vLLM (no vLLM environment)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    names = [s for s in args.schemes.split(",") if s]
    if any(s not in SCHEMES for s in names):
        ap.error(f"unknown scheme in {names}; known: {', '.join(SCHEMES)}")
    import copy

    from transformers import AutoModelForCausalLM

    from lowbit.checkpoint import load_model, load_quantized, save_quantized
    from lowbit.data import calibration_ids
    from lowbit.eval.windows import eval_windows
    from lowbit.export import export_compressed_tensors
    from lowbit.io.atomic import write_json
    from lowbit.quantize import get_scheme, quantize_model
    from lowbit.quantize.overrides import apply_overrides

    base, tok = load_model("default", dtype=torch.float32)
    windows = eval_windows(tok, "wikitext2", args.seqlen, args.windows)
    n, s = (int(v) for v in args.calib.lower().split("x"))
    calib = calibration_ids(tok, n, s)
    rows = [{"scheme": "float", "lowbit": _ppl(base.eval(), windows)}]
    folders = {}
    for name in names:
        preset, sets = SCHEMES[name]
        model = copy.deepcopy(base)
        t0 = time.perf_counter()
        quantize_model(model, apply_overrides(get_scheme(preset), sets), calib, progress=False)
        ckpt, folder = args.work / name, args.work / f"{name}-ct"
        save_quantized(model, ckpt, tok)
        del model
        export_compressed_tensors(load_quantized(ckpt)[0], folder, tok)
        row = {"scheme": name, "quantize_s": time.perf_counter() - t0,
               "lowbit": _ppl(load_quantized(ckpt)[0].eval(), windows),
               "lowbit_kernels": _ppl(load_model(str(ckpt))[0].eval(), windows),
               "lowbit_nudged": _ppl(_nudged(load_quantized(ckpt)[0]).eval(), windows),
               "transformers": _ppl(_transformers(AutoModelForCausalLM, folder, windows), windows),
               "lowbit_import": _ppl(load_model(str(folder))[0].eval(), windows)}
        rows.append(row)
        folders[name] = folder
        print(row, flush=True)
    vllm = None
    if not args.no_vllm:
        from lowbit.bench.vllm_engine import find_python
        from lowbit.vllm_plugin.runner import run

        os.environ.setdefault("VLLM_CPU_INT4_W4A8", "0")
        llm = {"dtype": "bfloat16", "enforce_eager": True, "max_model_len": args.seqlen + 8, "max_num_seqs": 4}
        job = [{"kind": "nll", "windows": windows.tolist()}]
        vllm = run({"engines": [{"llm": {"model": str(f), **llm}, "jobs": job} for f in folders.values()]},
                   timeout=3 * 3600, python=find_python())
        for row, eng in zip(rows[1:], vllm["engines"]):
            if "error" in eng:
                row["vllm_error"] = eng["error"]
                continue
            nll = eng["jobs"][0]
            row["vllm"] = math.exp(sum(nll["nll_sum"]) / sum(nll["n_tokens"]))
    cols = ("lowbit_kernels", "lowbit_nudged", "transformers", "lowbit_import", "vllm")
    print("\n| checkpoint | lowbit (reference) | lowbit (kernels) | reference, embeddings nudged 1e-7 | "
          "transformers on the export | lowbit importing it | vLLM-CPU (bf16) |")
    print("|---|" + "---:|" * (len(cols) + 1))
    for r in rows[1:]:
        cells = [f"{r[k]:.3f} ({r[k] / r['lowbit'] - 1:+.2%})" if k in r else "-" for k in cols]
        print(f"| {r['scheme']} | {r['lowbit']:.3f} | " + " | ".join(cells) + " |")
    print(f"float: {rows[0]['lowbit']:.3f}")
    if args.json:
        write_json(args.json, {"meta": {"windows": args.windows, "seqlen": args.seqlen, "calib": args.calib,
                                        "vllm": vllm["vllm"] if vllm else None, "load_avg": os.getloadavg()},
                               "rows": rows})


if __name__ == "__main__":
    main()
