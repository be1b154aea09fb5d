"""Tile sweep of the Triton W4A4 GEMM on a CUDA GPU (run by ``scripts/gpu_check.sh kernels``).

For Llama-7B's shapes at a few token counts: bf16 ``F.linear`` (cuBLAS), the activation
quantizer alone, and the GEMM on pre-quantized codes for each (BM, BO, warps, stages), all as
CUDA graph replays over weight copies past L2; every
configuration's output must equal the default configuration's bit for bit (the int32 group dots
are exact and the groups are rescaled in the same order whatever the tile), else it is marked.
Prints a table and writes one JSON file: ``python scripts/gpu_w4a4_tiles.py OUT.json``.
"""

from __future__ import annotations

import itertools
import json
import statistics
import sys

import torch
import torch.nn.functional as F

from lowbit.kernels import from_float
from lowbit.kernels.triton.act_codes import quantize_tokens_triton
from lowbit.kernels.triton.w4a4 import matmul, prepare

CASES = ((4096, 4096, 64), (4096, 4096, 512), (4096, 11008, 512))  # (in, out, tokens)
TILES = [(bm, bo, wa, st) for bm, bo, wa, st in itertools.product((64, 128, 256), (32, 64, 128, 256), (4, 8), (3, 4))
         if bm * bo <= 128 * 128 or wa == 8]


def graph_us(fns) -> float:
    """Median microseconds per call of ``fns`` (one call each, over weight copies that together
    exceed the L2 cache) replayed as one CUDA graph: kernel time without Python launch cost,
    as vLLM runs decode steps."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for f in fns:
            f()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for f in fns:
            f()
    g.replay()
    ts = []
    for _ in range(7):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3 / len(fns))
    return statistics.median(ts)


def copies(nbytes: int) -> int:
    return max(2, -(-3 * torch.cuda.get_device_properties(0).L2_cache_size // nbytes))


def main(path: str) -> None:
    rows = []
    for n_in, n_out, t in CASES:
        torch.manual_seed(0)
        p = from_float(torch.randn(n_out, n_in) / n_in ** 0.5, "w4a4", group=128, n_outliers=128, act_clip=0.9)
        ws = [prepare(p, "cuda") for _ in range(copies(n_out * n_in // 2))]
        wbs = [torch.randn(n_out, n_in, device="cuda", dtype=torch.bfloat16) / n_in ** 0.5
               for _ in range(copies(2 * n_in * n_out))]
        x = torch.randn(t, n_in, device="cuda")
        xb = x.bfloat16()
        k = ws[0].outlier.shape[1]
        a = quantize_tokens_triton(x, ws[0].act, k, None)
        ref = matmul(a.codes, a.scale, a.outlier, a.outlier_scale, ws[0])
        mm = lambda w, **kw: (lambda: matmul(a.codes, a.scale, a.outlier, a.outlier_scale, w, **kw))  # noqa: E731
        row = {"in": n_in, "out": n_out, "tokens": t, "w4a4_copies": len(ws), "bf16_copies": len(wbs),
               "bf16_us": graph_us([lambda w=w: F.linear(xb, w) for w in wbs]),
               "act_quant_us": graph_us([lambda: quantize_tokens_triton(x, ws[0].act, k, None)] * 8),
               "default_us": graph_us([mm(w) for w in ws]), "tiles": []}
        for bm, bo, wa, st in TILES:
            kw = dict(block_m=bm, block_o=bo, num_warps=wa, num_stages=st)
            try:
                same = bool(torch.equal(mm(ws[0], **kw)(), ref))
                row["tiles"].append({"bm": bm, "bo": bo, "warps": wa, "stages": st, "us": graph_us([mm(w, **kw) for w in ws]),
                                     "same_bits": same})
            except Exception as e:  # a tile that does not fit (shared memory, registers) is recorded, not fatal
                row["tiles"].append({"bm": bm, "bo": bo, "warps": wa, "stages": st, "error": str(e).splitlines()[0][:120]})
        ok = [c for c in row["tiles"] if "us" in c]
        best = min(ok, key=lambda c: c["us"]) if ok else None
        row["best"] = best
        rows.append(row)
        gemm = best["us"] if best else row["default_us"]
        bt = f"{gemm:.1f} us (BM {best['bm']}, BO {best['bo']}, warps {best['warps']}, stages {best['stages']})" if best else "-"
        print(f"{n_in}x{n_out} t={t}: bf16 {row['bf16_us']:.1f} us, act quant {row['act_quant_us']:.1f} us, "
              f"gemm default {row['default_us']:.1f} us, best {bt}; (best + quant) vs bf16 "
              f"{row['bf16_us'] / (gemm + row['act_quant_us']):.2f}x, gemm alone {row['bf16_us'] / gemm:.2f}x; "
              f"tiles differing in bits: {sum(1 for c in ok if not c['same_bits'])}/{len(ok)}, "
              f"failed: {len(row['tiles']) - len(ok)}", flush=True)
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "timing": "CUDA graph replay, median of 7"}
    with open(path, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "w4a4_tiles.json")
