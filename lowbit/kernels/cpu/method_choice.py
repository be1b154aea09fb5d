"""How a CPU kernel kind picks its method: the one asked for (else its default), checked against
the kind's METHODS with one message; and whether this torch build has one of its operators."""

from __future__ import annotations

import os

import torch

from lowbit.kernels.linear_params import KernelError
from lowbit.native.cpu_features import cpu_info


def pick_method(method: str, methods: tuple[str, ...], kind: str) -> str:
    """``method`` if it is one of ``methods``, else a KernelError naming ``kind``'s methods."""
    if method not in methods:
        raise KernelError(f"cpu {kind} method must be one of {methods}, got {method!r}")
    return method


def has_aten_op(name: str) -> bool:
    """Whether this torch build has ``torch.ops.aten.<name>`` (the packed-int CPU matmuls vary)."""
    return hasattr(torch.ops.aten, name)


def onednn_cap() -> str:
    """oneDNN's ISA cap as it reads one (``ONEDNN_MAX_CPU_ISA``, else ``DNNL_MAX_CPU_ISA``), upper
    case; ``"ALL"`` where neither is set. What torch's oneDNN kernels may run here depends on it."""
    return (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "").strip().upper() or "ALL"


# oneDNN ISA caps whose int8 kernels have no VNNI: they sum u8 x s8 pairs in int16 with saturation
_ONEDNN_CAPS_WITHOUT_VNNI = ("SSE41", "AVX", "AVX2", "AVX512_CORE")


def int_mm_exact() -> str | None:
    """None where ``torch._int_mm`` gives exact int32 products here, else why not. On a CPU with
    VNNI, torch hands ``_int_mm`` to oneDNN; with oneDNN capped below VNNI (``ONEDNN_MAX_CPU_ISA``
    or ``DNNL_MAX_CPU_ISA`` = AVX2 or AVX512_CORE, as when an older CPU is imitated) its int8
    kernels saturate and the products come back wrong (measured: 17x2500 by 2500x40 off by up to
    180618), silently. Without VNNI torch runs its own exact loop."""
    cap = onednn_cap()
    f = cpu_info()["features"]
    if cap in _ONEDNN_CAPS_WITHOUT_VNNI and (f.get("avx512_vnni") or f.get("avx_vnni") or f.get("amx_int8")):
        return (f"torch._int_mm is not exact under ONEDNN_MAX_CPU_ISA={cap} (oneDNN's int8 kernels without "
                "VNNI saturate): unset the cap or choose another method")
    return None
