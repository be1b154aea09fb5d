"""How far the main job's perplexity moves when the INT4 KV cache's inputs move by float32
rounding: the main job's model (``w4a4-kv4-rot``, GPTQ on 16 x 512 calibration tokens), quantized
once, then evaluated on the main job's 5 WikiText-2 windows of 512 with every key and value state
multiplied by ``1 + eps·N(0, 1)`` (a fresh seed per run) before the cache rotates and quantizes it.
A W4A4 model rounds its activations to 16 levels, so a change far below any rounding step can flip
codes that later layers amplify: this measures that noise floor, against which a change of the
figure by a few tenths of a percent (a different but equally exact float32 order of operations)
has to be read.

    .venv/bin/python scripts/kv_rounding_sensitivity.py [--eps 1e-6] [--seeds 4] [OUT.json]
"""
import argparse
import statistics

import torch
from lowbit.checkpoint import load_model
from lowbit.data import calibration_ids
from lowbit.eval.float_comparison import compare_to_float, float_reference
from lowbit.quantize import get_scheme, quantize_model
import lowbit.nn.kv_cache as kv_cache


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--eps", type=float, default=1e-6)
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("out", nargs="?")
    cli = ap.parse_args()
    model, tok = load_model("default")
    quantize_model(model, get_scheme("w4a4-kv4-rot"), calibration_ids(tok, 16, 512), device="cpu")
    window = dict(seqlen=512, max_windows=5)
    ref = float_reference(None, lambda: load_model("default")[0], tok, **window)
    rotate = kv_cache.PackedKV.rotate
    noise = {"eps": 0.0, "gen": None}

    def perturbed(self, x):
        if noise["eps"]:
            x = x.float() * (1 + noise["eps"] * torch.randn(x.shape, generator=noise["gen"]))
        return rotate(self, x)

    kv_cache.PackedKV.rotate = perturbed
    runs = []
    for seed in [None] + list(range(cli.seeds)):
        noise["eps"] = 0.0 if seed is None else cli.eps
        noise["gen"] = None if seed is None else torch.Generator().manual_seed(seed)
        r = compare_to_float(ref, model, tok, **window)
        runs.append({"seed": seed, "eps": noise["eps"], "ppl": r["ppl"], "ratio": r["ratio"], "mean_kl": r["mean_kl"]})
        print(runs[-1], flush=True)
    kv_cache.PackedKV.rotate = rotate
    ppl = [r["ppl"] for r in runs[1:]]
    summary = {"unperturbed": runs[0]["ppl"], "perturbed_min": min(ppl), "perturbed_max": max(ppl),
               "perturbed_median": statistics.median(ppl)}
    print(summary)
    if cli.out:
        from lowbit.bench.machine import report
        from lowbit.io.atomic import write_json
        write_json(cli.out, {"machine": report(), "what": __doc__, "runs": runs, "summary": summary})


if __name__ == "__main__":
    main()
