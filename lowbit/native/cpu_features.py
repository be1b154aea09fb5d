"""What this CPU can run: its model and the instruction-set features lowbit's kernels (and torch's)
care about, read from ``/proc/cpuinfo`` (Linux x86; elsewhere only the machine name). Every
benchmark records it, and ``lowbit env`` prints it: CPUs differ between machines, and a number
without the CPU it ran on cannot be compared."""

from __future__ import annotations

import os
import platform
from functools import lru_cache
from pathlib import Path

# the features that change which code is fast or even runnable, in the order lscpu prints them
FEATURES = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx_vnni", "avx512_bf16",
            "avx512_fp16", "amx_tile", "amx_int8", "amx_bf16")


@lru_cache(maxsize=1)
def cpu_info() -> dict:
    """``{"model", "vendor", "machine", "cores", "features": {name: bool}}`` for this machine
    (vendor: cpuinfo's ``vendor_id``, e.g. AuthenticAMD, GenuineIntel; "" where it has none)."""
    model, vendor, flags = platform.processor() or platform.machine(), "", set()
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name":
            model = value.strip()
        elif key == "vendor_id" and not vendor:
            vendor = value.strip()
        elif key in ("flags", "Features") and not flags:
            flags = set(value.split())
    return {"model": model, "vendor": vendor, "machine": platform.machine(), "cores": os.cpu_count(),
            "features": {f: f in flags for f in FEATURES}}


def summary() -> str:
    """One line: the model and the features it has (what a benchmark table title names)."""
    info = cpu_info()
    have = [f for f, ok in info["features"].items() if ok]
    return f"{info['model']} ({info['cores']} cores; {' '.join(have) or 'no AVX2'})"
