"""How a CPU kernel kind picks its method: the one asked for (else its default), checked against
the kind's METHODS with one message; and whether this torch build has one of its operators."""

from __future__ import annotations

import torch

from lowbit.kernels.linear_params import KernelError


def pick_method(method: str, methods: tuple[str, ...], kind: str) -> str:
    """``method`` if it is one of ``methods``, else a KernelError naming ``kind``'s methods."""
    if method not in methods:
        raise KernelError(f"cpu {kind} method must be one of {methods}, got {method!r}")
    return method


def has_aten_op(name: str) -> bool:
    """Whether this torch build has ``torch.ops.aten.<name>`` (the packed-int CPU matmuls vary)."""
    return hasattr(torch.ops.aten, name)
