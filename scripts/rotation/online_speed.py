"""Decode speed of a rotated preset with its online Hadamards in C (what runs: the block
Hadamard of the ``-rot`` presets, R4's whole-input one at down_proj) against their torch paths,
side by side on one quantized model (interleaved, medians); the greedy tokens must be equal (the
two paths give the same bits).

    PYTHONPATH=. python scripts/rotation/online_speed.py [--scheme w4a4-rot] [--threads 1]
    PYTHONPATH=. python scripts/rotation/online_speed.py --scheme w4a4 --set rotation.kind=hadamard rotation.r4=true
"""

import argparse
import statistics
import time

import torch

import lowbit.nn.online_hadamard as online
from lowbit.accelerate import accelerate
from lowbit.accelerate.native_ops import use_native_ops
from lowbit.checkpoint import load_model
from lowbit.data import calibration_ids
from lowbit.quantize import get_scheme, quantize_model
from lowbit.quantize.overrides import apply_overrides


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scheme", default="w4a4-rot")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--set", nargs="*", default=[], help="scheme overrides, as lowbit quantize --set")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    model, tok = load_model("default", dtype=torch.float32)
    scheme = apply_overrides(get_scheme(a.scheme), ["gptq.enabled=false", "weights.clip_search=false", *a.set])  # speed only
    quantize_model(model, scheme, calibration_ids(tok, 2, 64), progress=False)
    print(dict(accelerate(model.eval(), "auto")), dict(use_native_ops(model)))
    ids = tok("The capital of France is", return_tensors="pt").input_ids
    c_paths = online.block_hadamard, online.input_hadamard

    def use(c: bool) -> None:  # None from a C wrapper: the module's torch path
        online.block_hadamard, online.input_hadamard = c_paths if c else (lambda *args, **kw: None,) * 2

    def generate(use_c: bool, b: int):
        use(use_c)
        with torch.inference_mode():
            t0 = time.perf_counter()
            out = model.generate(ids.repeat(b, 1), attention_mask=torch.ones(b, ids.shape[1], dtype=torch.long),
                                 max_new_tokens=a.new, min_new_tokens=a.new, do_sample=False)
            return time.perf_counter() - t0, out

    for b in (int(v) for v in a.batches.split(",")):
        times, outs = {True: [], False: []}, {}
        for _ in range(a.repeats):
            for use_c in (True, False):
                dt, outs[use_c] = generate(use_c, b)
                times[use_c].append(dt)
        c, t = statistics.median(times[True]), statistics.median(times[False])
        print(f"{a.scheme} {' '.join(a.set)} batch {b}: C {a.new * b / c:.1f} tok/s, torch {a.new * b / t:.1f} tok/s, "
              f"{t / c:.2f}x, same tokens: {torch.equal(outs[True], outs[False])}")
    use(True)


if __name__ == "__main__":
    main()
