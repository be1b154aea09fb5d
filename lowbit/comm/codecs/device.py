"""The codec calls of the all-reduce, per device: CUDA tensors of the INT8/INT4 codecs go to the
fused Triton kernels (``triton.py``), everything else to ``fast.py`` (C on CPU, torch ops).

Both write the reference's bytes, so ranks may mix them. LOWBIT_QR_TRITON=0 keeps CUDA tensors
on the torch codec (for comparison); without triton installed they stay there too.
"""

from __future__ import annotations

import functools
import os

import torch

from . import fast
from .spec import Codec


@functools.cache
def _triton_module():
    try:
        from . import triton as tc
    except ImportError:  # triton not installed
        return None
    return tc


def uses_triton(t: torch.Tensor, codec: Codec) -> bool:
    """Whether a codec call on ``t`` runs the Triton kernels."""
    if t.device.type != "cuda" or os.environ.get("LOWBIT_QR_TRITON", "1") == "0":
        return False
    tc = _triton_module()
    return tc is not None and codec.name in tc.SUPPORTED


def encode(x: torch.Tensor, codec: Codec, *, fp_wire: torch.dtype | None = None,
           out: torch.Tensor | None = None) -> torch.Tensor:
    if uses_triton(x, codec) and (out is None or out.is_contiguous()):
        return _triton_module().encode(x, codec, out=out)
    return fast.encode(x, codec, fp_wire=fp_wire, out=out)


def decode(wire: torch.Tensor, codec: Codec, n: int, dtype: torch.dtype, *, fp_wire: torch.dtype | None = None,
           out: torch.Tensor | None = None) -> torch.Tensor:
    if uses_triton(wire, codec) and (out is None or out.is_contiguous()):
        return _triton_module().decode(wire, codec, n, dtype, out=out)
    return fast.decode(wire, codec, n, dtype, fp_wire=fp_wire, out=out)


def decode_add(acc: torch.Tensor, wire: torch.Tensor, codec: Codec, *, fp_wire: torch.dtype) -> None:
    if uses_triton(wire, codec):
        acc += _triton_module().decode(wire, codec, acc.numel(), torch.float32)
    else:
        fast.decode_add(acc, wire, codec, fp_wire=fp_wire)


def reduce_encode(wires: list[torch.Tensor], codec: Codec, *, fp_wire: torch.dtype, clamp: float = 0.0,
                  out: torch.Tensor | None = None) -> torch.Tensor:
    if uses_triton(wires[0], codec) and (out is None or out.is_contiguous()):
        return _triton_module().reduce_encode(wires, codec, clamp=clamp, out=out)
    return fast.reduce_encode(wires, codec, fp_wire=fp_wire, clamp=clamp, out=out)
