"""One decode or prefill step's linears of the default model (30 layers of q|k|v 576x960, o 576x576,
gate|up 576x3072, down 1536x576), bf16 in and out, through lowbit's prepared kernels as vLLM's
plugin runs them (``PreparedLinear.batched``): torch's bf16 ``F.linear``, W8A8, W4A4 (64 INT8
outliers, groups of 128) without and with an input permutation (the reorder the plugin gives
every W4A4 linear: normal channels in order, then the outliers, as lowbit's quantizer makes it),
and W4A16 (groups of 128). Random weights of the model's shapes; each step's
linears in model order, the formats interleaved within every repeat, medians. What W4A4 pays over
W8A8 on a CPU, where both multiply int8 codes, and what it saves against W4A16.

Run with vLLM's environment (``.venv-vllm/bin/python``) it adds vLLM's own CPU kernels on the same
weights, prepared as vLLM's engine prepares them: ``vllm-bf16`` (its unquantized linear: oneDNN
``onednn_mm`` on pre-packed weights, or sgl-kernel's on AMX) and ``vllm-w8a8`` (its compressed-tensors
W8A8 with dynamic per-token activations: oneDNN int8, or sgl-kernel's ``int8_scaled_mm_with_quant``
on AMX), so lowbit's kernels are compared with the ones vLLM serves, not only with ``F.linear``.

    .venv/bin/python scripts/model_linears.py [--tokens 16,64,256] [--repeats 5] [--threads 2] [--json OUT]
    .venv-vllm/bin/python scripts/model_linears.py ...    # with vllm-bf16 and vllm-w8a8
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

SHAPES = [(576, 960), (576, 576), (576, 3072), (1536, 576)]  # (in, out)
LAYERS = 30


def outlier_order(n: int, k: int = 64) -> torch.Tensor:
    """An input reorder as lowbit's W4A4 quantizer makes one (its normal channels in order, then ``k``
    outlier channels), for channel square-sums of a few large channels among many small ones."""
    from lowbit.quantize.outliers import outlier_permutation

    return outlier_permutation(torch.randn(n).abs() ** 4, k)


def build() -> dict[str, list]:
    from lowbit.kernels.dispatch import prepare
    from lowbit.kernels.linear_params import from_float

    torch.manual_seed(0)
    calls: dict[str, list] = {"bf16": [], "w8a8": [], "w4a4": [], "w4a4+perm": [], "w4a16": []}
    for _ in range(LAYERS):
        for n_in, n_out in SHAPES:
            w = torch.randn(n_out, n_in) / n_in ** 0.5
            p4 = from_float(w, "w4a4", group=128, n_outliers=64, act_clip=0.9)
            calls["bf16"].append((n_in, lambda x, w=w.bfloat16(): F.linear(x, w)))
            calls["w8a8"].append((n_in, prepare(from_float(w, "w8a8"), "cpu").batched))
            calls["w4a4"].append((n_in, prepare(p4, "cpu").batched))
            calls["w4a4+perm"].append((n_in, prepare(p4, "cpu", input_perm=outlier_order(n_in)).batched))
            calls["w4a16"].append((n_in, prepare(from_float(w, "w4a16"), "cpu").batched))
            for name, f in _vllm_calls(w).items():
                calls.setdefault(name, []).append((n_in, f))
    return calls


def _vllm_calls(w: torch.Tensor) -> dict:
    """vLLM's bf16 and W8A8 linears of ``w`` as its CPU engine runs them ({} without vLLM). The
    int8 weights are lowbit's per-row symmetric W8A8 codes, so both int8 kinds multiply the same
    numbers."""
    try:
        from vllm import _custom_ops as vops
        from vllm.model_executor.layers.utils import check_cpu_sgl_kernel
    except ImportError:
        return {}
    from lowbit.kernels.linear_params import from_float

    wb = w.bfloat16()
    p8 = from_float(w, "w8a8")
    codes, scale = p8.codes.to(torch.int8).contiguous(), p8.scale.reshape(-1, 1).float().contiguous()
    n_out, n_in = wb.shape
    if check_cpu_sgl_kernel(n_out, n_in, torch.bfloat16):  # vLLM's choice in dispatch_cpu_unquantized_gemm
        packed = torch.ops._C.convert_weight_packed(wb)
        bf16 = lambda x: vops.weight_packed_linear_cpu(x, packed, n_out, None)  # noqa: E731
    else:
        handler = vops.create_onednn_mm(wb.t(), 32)
        bf16 = lambda x: vops.onednn_mm(handler, x, None)  # noqa: E731
    if check_cpu_sgl_kernel(n_out, n_in, torch.int8):  # CPUInt8ScaledMMLinearKernel's choice
        packed8 = torch.ops._C.convert_weight_packed(codes)
        s1 = scale[:, 0].contiguous()

        def w8a8(x):
            return torch.ops._C.int8_scaled_mm_with_quant(x, packed8, s1, None, x.dtype, True)
    else:
        dnnl = vops.create_onednn_scaled_mm(codes.t(), scale, torch.bfloat16, True, False, 32)

        def w8a8(x):
            xq, xs, xzp = vops.onednn_scaled_int8_quant(x, None, None, True)
            out = torch.empty(x.shape[0], n_out, dtype=x.dtype)
            return vops.onednn_scaled_mm(dnnl, xq, out, xs, xzp, None, None)
    return {"vllm-bf16": bf16, "vllm-w8a8": w8a8}


def _check_same_products(calls: dict, xs: dict) -> None:
    """vLLM's kinds compute what lowbit's do on the first linear (so the timing is of the right
    work): vllm-bf16 within bf16 rounding of ``F.linear``, vllm-w8a8 within int8 rounding of
    lowbit's W8A8 on the same codes (both quantize each token symmetrically to int8)."""
    pairs = [("vllm-bf16", "bf16", 0.02), ("vllm-w8a8", "w8a8", 0.03)]
    for mine, ref, bound in pairs:
        if mine in calls:
            n_in, f = calls[mine][0]
            want = calls[ref][0][1](xs[n_in]).float()
            err = ((f(xs[n_in]).float() - want).norm() / want.norm()).item()
            if not err <= bound:
                raise SystemExit(f"{mine} differs from {ref} by {err:.3g} relative (bound {bound}): not the same product")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", default="16,64,256")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    calls = build()
    rows = []
    for t in [int(s) for s in args.tokens.split(",")]:
        xs = {n: torch.randn(t, n).bfloat16() for n in {n for n, _ in SHAPES}}
        _check_same_products(calls, xs)
        times: dict[str, list[float]] = {k: [] for k in calls}
        for _ in range(args.repeats + 1):  # the first round warms up
            for k, fs in calls.items():
                t0 = time.perf_counter()
                for n_in, f in fs:
                    f(xs[n_in])
                times[k].append(time.perf_counter() - t0)
        ms = {k: statistics.median(v[1:]) * 1e3 for k, v in times.items()}
        rows.append({"tokens": t, **{f"{k}_ms": v for k, v in ms.items()}})
        print(f"{t:4d} tokens: " + "  ".join(f"{k} {v:7.2f} ms" for k, v in ms.items())
              + f"   w4a4/w8a8 {ms['w4a4'] / ms['w8a8']:.2f}  perm/no perm {ms['w4a4+perm'] / ms['w4a4']:.2f}"
              + f"  w4a4/w4a16 {ms['w4a4'] / ms['w4a16']:.2f}"
              + (f"  w4a4+perm/vllm-w8a8 {ms['w4a4+perm'] / ms['vllm-w8a8']:.2f}" if "vllm-w8a8" in ms else ""))
    if args.json:
        from lowbit.bench.machine import report
        from lowbit.io.atomic import write_json

        write_json(args.json, {"machine": report(), "threads": args.threads, "repeats": args.repeats, "rows": rows})


if __name__ == "__main__":
    main()
