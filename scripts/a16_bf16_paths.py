"""The paths a bfloat16 W4A16 / W8A16 call of many tokens can take, side by side: torch's bf16
``F.linear`` on the float weight (the baseline), lowbit's exact int16 tiles, the weight unpacked to
bfloat16 in memory then torch's matmul, and the bfloat16 products in C (AVX512_BF16 dot products,
or AMX-BF16 tiles where the build has them). The default model's four shapes and 4096², the paths
interleaved within every repeat, medians. What ``a16_gemm.DPBF16_TOKENS`` was chosen from.

    .venv/bin/python scripts/a16_bf16_paths.py [--kind w4a16|w8a16] [--tokens 16,64,128,512,2048]
        [--threads 2] [--repeats 7] [--json OUT]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

SHAPES = [(4096, 4096), (576, 3072), (1536, 576), (576, 960), (576, 576)]  # (in, out)


def paths(w: torch.Tensor, kind: str) -> dict:
    from lowbit.kernels.cpu import a16_gemm, w8a16
    from lowbit.kernels.linear_params import from_float

    lib = a16_gemm.library()
    p = from_float(w, kind, group=128) if kind == "w4a16" else from_float(w, kind)
    st = a16_gemm.prepare_w4(p) if kind == "w4a16" else w8a16.prepare(p, "gemm")
    wb = w.bfloat16()
    out = {"bf16": lambda x: F.linear(x, wb),
           "int16": lambda x: a16_gemm.a16_linear.call(lib.a16_gemm_linear, st.args, st.n_in, st.args[4], st.out,
                                                       st.bias, x, "a16 gemm kernel"),
           "unpack+matmul": lambda x: F.linear(x, a16_gemm.dequantize_bf16(st, lib, a16_gemm._weight_scratch((st.out, st.n_in))))}
    if a16_gemm.bf16_products(st.nibbles, lib):
        out["bf16 products"] = lambda x: a16_gemm._bf16_products(x, st, lib)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kind", default="w4a16", choices=["w4a16", "w8a16"])
    ap.add_argument("--tokens", default="16,64,128,512,2048")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    rows = []
    for n_in, n_out in SHAPES:
        fs = paths(torch.randn(n_out, n_in) / n_in**0.5, args.kind)
        for t in [int(s) for s in args.tokens.split(",")]:
            x = torch.randn(t, n_in).bfloat16()
            times: dict[str, list[float]] = {k: [] for k in fs}
            for _ in range(args.repeats + 1):  # the first round warms up
                for k, f in fs.items():
                    t0 = time.perf_counter()
                    f(x)
                    times[k].append(time.perf_counter() - t0)
            ms = {k: statistics.median(v[1:]) * 1e3 for k, v in times.items()}
            rows.append({"shape": f"{n_in}x{n_out}", "tokens": t, **{f"{k}_ms": v for k, v in ms.items()}})
            vs = "  ".join(f"{k} {ms[k] / ms['bf16 products']:.2f}x" for k in ms if k != "bf16 products") \
                if "bf16 products" in ms else ""
            print(f"{n_in}x{n_out} {t:5d} tokens: " + "  ".join(f"{k} {v:8.3f} ms" for k, v in ms.items())
                  + (f"   bf16 products vs {vs}" if vs else ""), flush=True)
    if args.json:
        from lowbit.bench.machine import report
        from lowbit.io.atomic import write_json

        write_json(args.json, {"machine": report(), "kind": args.kind, "threads": args.threads,
                               "repeats": args.repeats, "rows": rows})


if __name__ == "__main__":
    main()
