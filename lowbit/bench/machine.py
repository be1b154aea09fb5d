"""The machine a measurement ran on: CPU model and features, torch's build and capability, which
native libraries built, the kernel each quantized kind runs by default, and what W4A16 / W8A16
calls of many bfloat16 tokens run on, whether prepared weights sit in huge pages. ``lowbit env`` prints
it; every benchmark stores it in its JSON ``meta`` so a number always names its CPU."""

from __future__ import annotations


def report() -> dict:
    import torch

    from lowbit.comm.codecs import native as codecs_native
    from lowbit.kernels.cpu import (a16_gemm, decode_ops, hadamard, huge_pages, i8_gemm, kernel_threads, kv_packed,
                                   w4_gemv, w8_gemv, w8a8)
    from lowbit.kernels import from_float, prepare
    from lowbit.native import isa
    from lowbit.native.cpu_features import cpu_info

    libs = [("all-reduce codecs", codecs_native.available, codecs_native._LIB),
            ("4-bit linear", w4_gemv.available, w4_gemv._LIB),
            ("8-bit linear", w8_gemv.available, w8_gemv._LIB),
            ("batched int8 linear", i8_gemm.available, i8_gemm._LIB),
            ("batched A16 linear", a16_gemm.available, a16_gemm._LIB),
            ("decode ops", lambda: decode_ops.library() is not None, decode_ops._LIB),
            ("packed KV cache", lambda: kv_packed.library() is not None, kv_packed._LIB),
            ("online block Hadamard", lambda: hadamard.library() is not None, hadamard._LIB)]
    kernels = {}
    for kind in ("w4a16", "w8a16", "w8a8", "w4a4"):
        kernels[kind] = prepare(from_float(torch.zeros(16, 128), kind, group=128), "cpu").kernel
    wide = prepare(from_float(torch.zeros(16, w8a8.GEMM_MIN_IN_AVX2), "w8a8"), "cpu").kernel
    if wide != kernels["w8a8"]:  # AVX2 builds: the batched kernel for wide layers only
        kernels["w8a8"] += f"; {wide} from {w8a8.GEMM_MIN_IN_AVX2} inputs"
    return {"cpu": cpu_info(),
            "torch": {"version": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                      "threads": torch.get_num_threads()},
            "kernel_threads": kernel_threads(),
            "isa": {"selected": isa.selected().name,
                    "variants": {v.name: {"runnable": isa.runnable(v), "missing": isa.missing(v)} for v in isa.VARIANTS}},
            "native": [{"name": n, "built": bool(ok()), "source": lib.src.name,
                        "variant": isa.variant_of(lib.flags) if lib.flags else None} for n, ok, lib in libs],
            "kernels": kernels,
            "bf16_calls": {"w4a16": a16_gemm.bf16_calls(True), "w8a16": a16_gemm.bf16_calls(False)},
            "allreduce_int_codes": "divide" if codecs_native.divide_codes() else "reciprocal",
            "huge_pages": {"thp": huge_pages.thp_mode(), "weights": huge_pages.enabled()}}
