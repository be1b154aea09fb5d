"""How far the main job's perplexity moves when a model's numbers move by float32 rounding: a
preset (the main job's ``w4a4-kv4-rot`` by default; GPTQ on 16 x 512 calibration tokens),
quantized once, then evaluated on the main job's 5 WikiText-2 windows of 512 with every key and
value state multiplied by ``1 + eps·N(0, 1)`` (a fresh seed per run) before the INT4 cache rotates
and quantizes it (``--at kv``), or the token embeddings (``--at embeddings``, for any preset).
A W4A4 model rounds its activations to 16 levels, so a change far below any rounding step can flip
codes that later layers amplify: this measures that noise floor, against which a change of the
figure by a few tenths of a percent (a different but equally exact float32 order of operations)
has to be read.

    .venv/bin/python scripts/kv_rounding_sensitivity.py [--scheme w4a4-kv4-rot] [--at kv|embeddings]
        [--eps 1e-6] [--seeds 4] [OUT.json]
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
    ap.add_argument("--scheme", default="w4a4-kv4-rot")
    ap.add_argument("--at", choices=("kv", "embeddings"), default="kv")
    ap.add_argument("--eps", type=float, default=1e-6)
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("out", nargs="?")
    cli = ap.parse_args()
    model, tok = load_model("default")
    quantize_model(model, get_scheme(cli.scheme), calibration_ids(tok, 16, 512), device="cpu")
    window = dict(seqlen=512, max_windows=5)
    ref = float_reference(None, lambda: load_model("default")[0], tok, **window)
    rotate = kv_cache.PackedKV.rotate
    noise = {"eps": 0.0, "gen": None}

    def noisy(x):
        if not noise["eps"]:
            return x
        return (x.float() * (1 + noise["eps"] * torch.randn(x.shape, generator=noise["gen"]))).to(x.dtype)

    if cli.at == "kv":
        kv_cache.PackedKV.rotate = lambda self, x: rotate(self, noisy(x.float()))
    else:
        model.get_input_embeddings().register_forward_hook(lambda module, args, out: noisy(out))
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
        write_json(cli.out, {"machine": report(), "what": __doc__, "scheme": cli.scheme, "at": cli.at, "runs": runs,
                             "summary": summary})


if __name__ == "__main__":
    main()
