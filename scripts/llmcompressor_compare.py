"""lowbit's compressed-tensors exports against llm-compressor's checkpoints of the same schemes, all
served by vLLM's own CPU kernels: WikiText-2 perplexity (``prompt_logprobs``) and decode tok/s.

    python scripts/llmcompressor_compare.py --work DIR --llmc-python PY [--json OUT]

PY is a Python with llm-compressor (its pins differ from lowbit's and vLLM's; for example
``python3.11 -m venv /tmp/llmc && /tmp/llmc/bin/pip install torch==2.13.0+cpu llmcompressor==0.14.0.1``);
it runs ``scripts/llmcompressor_quantize.py``. Both tools calibrate on the same token windows
(``--calib``, WikiText-2 validation), keep the LM head float (vLLM's CPU build has no 8-bit
weight-only kernel) and export W8A8 (INT8 channel weights, dynamic per-token INT8 activations:
``int-quantized``) and W4A16 (INT4 symmetric groups of 64: ``pack-quantized``; 576 has no groups
of 128). lowbit's side: its ``w8a8`` preset (SmoothQuant 0.5, RTN) with and without GPTQ, and its
``w4a16`` preset at g64 as plain RTN, RTN with its clipping search (plain, and weighted by the
calibration inputs' energy), and the preset (GPTQ, act order, clipping). DIR receives the float folder, every checkpoint (later runs reuse them) and the
calibration ids. One vLLM process serves every folder in turn (bf16, eager): perplexity on the
first ``--windows`` WikiText-2 test windows of ``--seqlen``, then decode tok/s at each batch
(128-token prompts, 64 new tokens, no early stop; batch x 63 / (time for 64 tokens - time for 1),
medians of ``--repeats``). Needs the vLLM environment (``scripts/venv_vllm.sh``).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

PROMPT, NEW = 128, 64
QUANTIZE_SCRIPT = Path(__file__).with_name("llmcompressor_quantize.py")
LLMC = ("w8a8-rtn", "w8a8-sq-gptq", "w4a16-g64-rtn", "w4a16-g64-gptq")  # its recipes (see that script)
G64 = ["weights.group_size=64", "lm_head.bits=16"]
LOWBIT = {  # name -> (preset, overrides)
    "w8a8-sq-rtn": ("w8a8", ["lm_head.bits=16"]),
    "w8a8-sq-gptq": ("w8a8", ["lm_head.bits=16", "gptq.enabled=true"]),
    "w4a16-g64-rtn": ("w4a16", G64 + ["gptq.enabled=false", "gptq.act_order=false", "weights.clip_search=false"]),
    "w4a16-g64-rtn-clip": ("w4a16", G64 + ["gptq.enabled=false", "gptq.act_order=false"]),
    "w4a16-g64-rtn-wclip": ("w4a16", G64 + ["gptq.enabled=false", "gptq.act_order=false", "weights.clip_weighted=true"]),
    "w4a16-g64-gptq-clip": ("w4a16", G64),  # the preset: GPTQ, static act order, clipping search
}


def _scheme_of(name: str) -> str:
    return name.split("-")[0]


def _make_float(work: Path, n_calib: int, seqlen_calib: int):
    from lowbit.checkpoint import load_model
    from lowbit.data import calibration_ids

    base, tok = load_model("default", dtype=torch.float32)
    if not (work / "float" / "config.json").exists():
        base.save_pretrained(work / "float")
        tok.save_pretrained(work / "float")
    calib = calibration_ids(tok, n_calib, seqlen_calib)
    calib_path = work / "calib.json"
    calib_path.write_text(json.dumps({"input_ids": calib.tolist()}))
    return base, tok, calib, calib_path


def _make_llmc(work: Path, python: str, calib_path: Path, timeout: float, recipes: list[str]) -> dict:
    times = {}
    for recipe in recipes:
        out = work / f"llmc-{recipe}"
        if (out / "config.json").exists():
            continue
        t0 = time.perf_counter()
        log = work / f"llmc-{recipe}.log"  # llm-compressor's progress, readable while it runs
        with open(log, "w") as f:
            r = subprocess.run([python, str(QUANTIZE_SCRIPT), "--model", str(work / "float"), "--calib",
                                str(calib_path), "--recipe", recipe, "--out", str(out)], stdout=f, stderr=subprocess.STDOUT,
                               timeout=timeout)
        if r.returncode != 0:
            raise RuntimeError(f"llm-compressor {recipe} failed (exit {r.returncode}):\n{log.read_text()[-4000:]}")
        times[f"llmc-{recipe}"] = time.perf_counter() - t0
    return times


def _make_lowbit(work: Path, base, tok, calib, names: list[str]) -> dict:
    from lowbit.export import export_compressed_tensors
    from lowbit.quantize import get_scheme, quantize_model
    from lowbit.quantize.overrides import apply_overrides

    times = {}
    for name in names:
        preset, sets = LOWBIT[name]
        out = work / f"lowbit-{name}"
        if (out / "config.json").exists():
            continue
        t0 = time.perf_counter()
        model = copy.deepcopy(base)
        quantize_model(model, apply_overrides(get_scheme(preset), sets), calib, progress=False)
        times[f"lowbit-{name}"] = time.perf_counter() - t0
        export_compressed_tensors(model, out, tok)
    return times


def _versions(python: str) -> dict:
    probe = ("import importlib.metadata as m, json; print(json.dumps({p: m.version(p) for p in "
             "['llmcompressor', 'compressed-tensors', 'transformers', 'torch']}))")
    r = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=300)
    return json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else {"error": r.stderr[-500:]}


def _rows(folders: dict[str, Path], result: dict) -> list[dict]:
    rows = []
    for name, eng in zip(folders, result["engines"]):
        row = {"checkpoint": name, "tool": name.split("-")[0], "scheme": "float" if name == "float" else
               _scheme_of(name.split("-", 1)[1]), "folder": str(folders[name])}
        if "error" in eng:
            rows.append(row | {"error": eng["error"]})
            continue
        nll, dec = eng["jobs"]
        row["ppl"] = math.exp(sum(nll["nll_sum"]) / sum(nll["n_tokens"]))
        row["tokens"] = sum(nll["n_tokens"])
        for r in dec["rows"]:
            step = statistics.median(r["total_s"]) - statistics.median(r["prefill_s"])
            row[f"decode_tok_s_b{r['batch']}"] = r["batch"] * (NEW - 1) / step
        row["load_s"] = eng["load_s"]
        rows.append(row)
    ref = next((r for r in rows if r["checkpoint"] == "float" and "ppl" in r), None)
    for r in rows:
        if ref and "ppl" in r:
            r["ppl_vs_float"] = r["ppl"] / ref["ppl"]
            for k in [k for k in r if k.startswith("decode_tok_s_b")]:
                r[k.replace("decode_tok_s", "speed_vs_float")] = r[k] / ref[k]
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--llmc-python", required=True, help="a Python with llm-compressor")
    ap.add_argument("--calib", default="16x512", help="calibration SAMPLESxSEQLEN, the same for both tools")
    ap.add_argument("--windows", type=int, default=16, help="WikiText-2 test windows for perplexity")
    ap.add_argument("--seqlen", type=int, default=512)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--llmc-recipes", default=",".join(LLMC), help="comma list of " + ", ".join(LLMC))
    ap.add_argument("--lowbit-schemes", default=",".join(LOWBIT), help="comma list of " + ", ".join(LOWBIT))
    ap.add_argument("--reverse", action="store_true",
                    help="serve the quantized folders in reverse order (float first still): shows what the order costs")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    recipes, schemes = ([x for x in v.split(",") if x] for v in (args.llmc_recipes, args.lowbit_schemes))
    bad = [r for r in recipes if r not in LLMC] + [s for s in schemes if s not in LOWBIT]
    if bad:
        ap.error(f"unknown recipe or scheme: {', '.join(bad)}")
    from lowbit.bench.vllm_engine import find_python
    from lowbit.eval.windows import eval_windows
    from lowbit.io.atomic import write_json
    from lowbit.vllm_plugin.runner import run

    vllm_python = find_python()
    os.environ.setdefault("VLLM_CPU_INT4_W4A8", "0")  # W4A16 as A16 on AMX CPUs too (README, export section)
    args.work.mkdir(parents=True, exist_ok=True)
    n, s = (int(v) for v in args.calib.lower().split("x"))
    load_before = os.getloadavg()
    base, tok, calib, calib_path = _make_float(args.work, n, s)
    quantize_s = _make_llmc(args.work, args.llmc_python, calib_path, 3600, recipes)
    quantize_s |= _make_lowbit(args.work, base, tok, calib, schemes)
    folders = {"float": args.work / "float"}
    for scheme in ("w8a8", "w4a16"):
        folders |= {f"llmc-{r}": args.work / f"llmc-{r}" for r in recipes if r.startswith(scheme + "-")}
        folders |= {f"lowbit-{r}": args.work / f"lowbit-{r}" for r in schemes if r.startswith(scheme + "-")}
    if args.reverse:
        folders = {"float": folders["float"]} | dict(reversed([(k, v) for k, v in folders.items() if k != "float"]))
    windows = eval_windows(tok, "wikitext2", args.seqlen, args.windows).tolist()
    prompts = eval_windows(tok, "wikitext2", PROMPT, max(args.batches)).tolist()
    jobs = [{"kind": "nll", "windows": windows},
            {"kind": "decode", "prompts": prompts, "batches": args.batches, "new": NEW, "repeats": args.repeats}]
    llm = {"dtype": "bfloat16", "enforce_eager": True, "max_model_len": max(args.seqlen, PROMPT + NEW) + 8,
           "max_num_seqs": max(args.batches)}
    t0 = time.perf_counter()
    result = run({"engines": [{"llm": {"model": str(f), **llm}, "jobs": jobs} for f in folders.values()]},
                 timeout=6 * 3600, python=vllm_python)
    rows = _rows(folders, result)
    meta = {"vllm": result["vllm"], "llmcompressor_env": _versions(args.llmc_python), "calib": args.calib,
            "windows": args.windows, "seqlen": args.seqlen, "batches": args.batches, "repeats": args.repeats,
            "quantize_s": quantize_s, "vllm_s": time.perf_counter() - t0, "load_avg_before": load_before,
            "load_avg_after": os.getloadavg(), "cpu": _cpu(), "lowbit_schemes": LOWBIT,
            "order": list(folders)}
    _print(rows, args.batches)
    if args.json:
        write_json(args.json, {"meta": meta, "rows": rows})


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip() + f" x{os.cpu_count()}"
    return sys.platform


def _print(rows: list[dict], batches: list[int]) -> None:
    head = ["checkpoint", "ppl", "vs float"] + [f"b{b} tok/s (vs float)" for b in batches]
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for r in rows:
        if "error" in r:
            print(f"| {r['checkpoint']} | error: {r['error'][:120]} |")
            continue
        cells = [r["checkpoint"], f"{r['ppl']:.3f}", f"{r.get('ppl_vs_float', float('nan')):.4f}x"]
        cells += [f"{r[f'decode_tok_s_b{b}']:.1f} ({r.get(f'speed_vs_float_b{b}', float('nan')):.2f}x)" for b in batches]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
