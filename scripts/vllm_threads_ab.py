"""lowbit's W8A8 linears between vLLM's own OpenMP operators, with the kernels' threads on lowbit's
pool against torch's OpenMP team and auto, the default (``LOWBIT_THREADS``), beside vLLM's int8 kernel and bf16: how
much a second thread pool costs inside vLLM's engine, without starting one.

A "step" is 30 decoder layers of the default model's shapes without attention: vLLM's ``rms_norm``
and ``silu_and_mul`` (its C++ OpenMP kernels) around the four linears (qkv 576->960, o 576->576,
gate/up 576->3072, down 1536->576), as vLLM's CPU engine runs them back to back. The linears are
lowbit's op (``torch.ops.lowbit.linear``'s body), vLLM's ``int8_scaled_mm_with_quant`` (its AMX int8
kernel with the per-token quantization fused; AMX CPUs only) or bf16 ``F.linear``. One process per
mode (the setting is read at a kernel's first call); medians over the repeats, the kinds
interleaved. Run with vLLM's environment:

    .venv-vllm/bin/python scripts/vllm_threads_ab.py [--tokens 4 32 128] [--repeats 9] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

SHAPES = {"qkv": (576, 960), "o": (576, 576), "gate_up": (576, 3072), "down": (1536, 576)}
LAYERS = 30


def _measure(tokens: list[int], repeats: int) -> list[dict]:
    import torch
    import torch.nn.functional as F
    import vllm._custom_ops  # noqa: F401  (loads torch.ops._C)

    from lowbit.kernels import ops
    from lowbit.kernels.cpu import kernel_threads
    from lowbit.kernels.dispatch import prepare
    from lowbit.kernels.linear_params import from_float

    torch.manual_seed(0)
    amx = torch.cpu._is_amx_tile_supported()
    kinds = ["lowbit_w8a8", "bf16"] + (["vllm_int8"] if amx else [])
    layers = []
    for _ in range(LAYERS):
        layer = {}
        for name, (k, o) in SHAPES.items():
            w = torch.randn(o, k) / k ** 0.5
            p = from_float(w, "w8a8")
            layer[name] = {"lowbit_w8a8": ops.register(prepare(p, "cpu")), "bf16": w.bfloat16()}
            if amx:
                packed = torch.ops._C.convert_weight_packed(p.codes.to(torch.int8).contiguous())
                layer[name]["vllm_int8"] = (packed, p.scale[:, 0].float().contiguous())
        layers.append(layer)
    norm_w = torch.ones(576).bfloat16()

    def linear(kind, x, layer, name):
        w = layer[name][kind]
        if kind == "lowbit_w8a8":
            return ops.linear(x, w)
        if kind == "vllm_int8":
            return torch.ops._C.int8_scaled_mm_with_quant(x, w[0], w[1], None, x.dtype, True)
        return F.linear(x, w)

    def norm(x):
        out = torch.empty_like(x)
        torch.ops._C.rms_norm(out, x, norm_w, 1e-5)
        return out

    def step(kind, t):
        x = torch.randn(t, 576).bfloat16()
        for layer in layers:
            qkv = linear(kind, norm(x), layer, "qkv")
            x = x + linear(kind, qkv[:, :576].contiguous(), layer, "o")
            gate_up = linear(kind, norm(x), layer, "gate_up")
            act = torch.empty(t, 1536, dtype=x.dtype)
            torch.ops._C.silu_and_mul(act, gate_up)
            x = x + linear(kind, act, layer, "down")
        return x

    rows = []
    for t in tokens:
        times = {k: [] for k in kinds}
        for kind in kinds:
            step(kind, t)  # warm
        for _ in range(repeats):
            for kind in kinds:
                t0 = time.perf_counter()
                step(kind, t)
                times[kind].append(time.perf_counter() - t0)
        rows.append({"tokens": t, "kernel_threads": kernel_threads(), "torch_threads": torch.get_num_threads(),
                     **{f"{k}_ms": 1e3 * statistics.median(v) for k, v in times.items()}})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, nargs="+", default=[4, 32, 128])
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(_measure(args.tokens, args.repeats)))
        return
    rows = []
    for mode in ("pool", "omp", "auto"):
        env = dict(os.environ, LOWBIT_THREADS=mode)
        out = subprocess.run([sys.executable, __file__, "--child", "--tokens", *map(str, args.tokens), "--repeats",
                              str(args.repeats)], env=env, capture_output=True, text=True, check=True).stdout
        got = json.loads(out.strip().splitlines()[-1])
        if any(r["kernel_threads"] != mode for r in got):
            raise SystemExit(f"LOWBIT_THREADS={mode} was not taken up: {got}")
        rows += got
    print("ms per step (30 layers, no attention):")
    for r in rows:
        print(f"  {r['kernel_threads']:4s} {r['tokens']:4d} tokens: lowbit W8A8 {r['lowbit_w8a8_ms']:7.2f}  "
              f"bf16 {r['bf16_ms']:7.2f}" + (f"  vLLM int8 {r['vllm_int8_ms']:7.2f}" if "vllm_int8_ms" in r else ""))
    if args.json:
        from lowbit.bench.machine import report
        from lowbit.io.atomic import write_json

        write_json(args.json, {"machine": report(), "rows": rows})


if __name__ == "__main__":
    main()
