"""The machine a measurement ran on: CPU model and features, torch's build and capability, which
native libraries built, and the kernel each quantized kind runs by default. ``lowbit env`` prints
it; every benchmark stores it in its JSON ``meta`` so a number always names its CPU."""

from __future__ import annotations


def report() -> dict:
    import torch

    from lowbit.comm.codecs import native as codecs_native
    from lowbit.kernels import cpu_decode_ops, cpu_w4_gemv, cpu_w8_gemv, from_float, prepare
    from lowbit.kernels.cpu_features import cpu_info

    libs = [("all-reduce codecs", codecs_native.available, codecs_native._SRC),
            ("4-bit linear", cpu_w4_gemv.available, cpu_w4_gemv._LIB.src),
            ("8-bit linear", cpu_w8_gemv.available, cpu_w8_gemv._LIB.src),
            ("decode ops", lambda: cpu_decode_ops.library() is not None, cpu_decode_ops._LIB.src)]
    kernels = {}
    for kind in ("w4a16", "w8a16", "w8a8", "w4a4"):
        kernels[kind] = prepare(from_float(torch.zeros(16, 128), kind, group=128), "cpu").kernel
    return {"cpu": cpu_info(),
            "torch": {"version": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                      "threads": torch.get_num_threads()},
            "native": [{"name": n, "built": bool(ok()), "source": src.name} for n, ok, src in libs],
            "kernels": kernels}
