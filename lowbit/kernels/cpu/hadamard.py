"""The online block Hadamard of rotated quantized linears in one C call (``csrc/hadamard.c``):
the first ``normal`` channels of each row in power-of-two blocks times ``H/√block``, the rest
copied. The same bits as the torch path (:func:`block_hadamard_reference`, what
``BlockHadamard`` ran before), which it replaces on every call of a rotated preset's linears.
"""

from __future__ import annotations

import ctypes
import functools
import math

import torch

from lowbit.kernels.cpu.kernel_library import KernelLibrary

MAX_BLOCK = 128
_F32, _BF16 = torch.float32, torch.bfloat16


def _bind(lib: ctypes.CDLL) -> None:
    i64, vp, ci = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
    lib.block_hadamard.argtypes = [vp, ci, i64, i64, i64, i64, ci, ctypes.c_float, vp]
    lib.block_hadamard.restype = ci


_LIB = KernelLibrary("block Hadamard", "hadamard.c", _bind)


def library(flags: tuple[str, ...] | None = None) -> ctypes.CDLL | None:
    return _LIB.get(flags)


def block_hadamard_reference(x: torch.Tensor, normal: int, block: int) -> torch.Tensor:
    """The torch formulation: ``fast_transform`` on blocks of the first ``normal`` channels (in
    float32 for narrower inputs), the rest unchanged, one cast back to x's dtype."""
    from lowbit.formats.hadamard import fast_transform

    dt = x.dtype
    x = x if dt in (torch.float32, torch.float64) else x.float()
    lead = x.shape[:-1]
    head = fast_transform(x[..., :normal].reshape(*lead, normal // block, block))
    return torch.cat([head.reshape(*lead, normal), x[..., normal:]], -1).to(dt)


@functools.lru_cache(maxsize=None)
def _scale(block: int) -> float:
    """``1/√block`` rounded to float32, the multiplier torch applies to a float32 tensor."""
    return float(torch.tensor(1.0 / math.sqrt(block), dtype=torch.float32))


def block_hadamard(x: torch.Tensor, normal: int, block: int, lib=None) -> torch.Tensor | None:
    """:func:`block_hadamard_reference` in one call (float32 or bfloat16 on CPU, a unit last stride,
    no autograd), or None where it does not apply, so the caller keeps the torch path."""
    lib = lib or _LIB.get()
    dt = x.dtype
    n = x.shape[-1] if x.dim() else 0
    if (lib is None or (dt is not _F32 and dt is not _BF16) or not x.is_cpu or x.dim() == 0
            or (torch.is_grad_enabled() and x.requires_grad) or not 2 <= block <= MAX_BLOCK or block & (block - 1)
            or not 0 <= normal <= n or normal % block):
        return None
    x2 = x.reshape(-1, n) if n else x.reshape(0, 0)
    if x2.numel() and (x2.stride(1) != 1 or x2.stride(0) < n):
        x2 = x2.contiguous()
    y = torch.empty(x.shape, dtype=dt)
    if x2.numel():
        if lib.block_hadamard(x2.data_ptr(), dt is _BF16, x2.shape[0], n, x2.stride(0), normal, block, _scale(block),
                              y.data_ptr()):
            raise ValueError(f"block_hadamard: the C kernel refused normal={normal}, block={block}, n={n}")
    return y
