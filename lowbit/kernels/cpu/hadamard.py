"""The online Hadamards of rotated quantized linears in one C call each (``csrc/hadamard.c``):

* :func:`block_hadamard`: the first ``normal`` channels of each row in power-of-two blocks times
  ``H/√block``, the rest copied (``BlockHadamard``, every call of a ``-rot`` preset's linears);
* :func:`input_hadamard`: each whole row times ``H/√n`` for any order ``n = p·m`` with a known
  matrix (``InputHadamard``, QuaRot's R4 at down_proj: 1536 = 128·12 on the default model).

Both give the bits of their torch formulation (:func:`block_hadamard_reference`,
:func:`input_hadamard_reference`), which stays the path wherever the C call does not apply.
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
    lib.block_hadamard.argtypes = [vp, ci, i64, i64, i64, i64, ci, ctypes.c_float, vp, vp, ci]
    lib.block_hadamard.restype = ci
    lib.input_hadamard.argtypes = [vp, ci, i64, i64, i64, i64, i64, vp, ctypes.c_float, vp]
    lib.input_hadamard.restype = ci


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
def inverse_sqrt_f32(block: int) -> float:
    """``1/√block`` rounded to float32, the multiplier torch applies to a float32 tensor."""
    return float(torch.tensor(1.0 / math.sqrt(block), dtype=torch.float32))


def _applies(lib, x: torch.Tensor) -> bool:
    """A C call can replace the torch path: float32 or bfloat16 on CPU, no autograd."""
    return (lib is not None and x.dtype in (_F32, _BF16) and x.is_cpu and x.dim() > 0
            and not (torch.is_grad_enabled() and x.requires_grad))


def _rows(x: torch.Tensor, n: int) -> torch.Tensor:
    """x as rows of n values with a unit last stride (a view where it already is one)."""
    x2 = x.reshape(-1, n) if n else x.reshape(0, 0)
    if x2.numel() and (x2.stride(1) != 1 or x2.stride(0) < n):
        x2 = x2.contiguous()
    return x2


def block_hadamard(x: torch.Tensor, normal: int, block: int, lib=None, perm: torch.Tensor | None = None
                   ) -> torch.Tensor | None:
    """:func:`block_hadamard_reference` in one call (float32 or bfloat16 on CPU, a unit last stride,
    no autograd), or None where it does not apply, so the caller keeps the torch path. ``perm``
    (int64 ``[n]``): the transform of ``x[..., perm]``, the gather done in the same pass (the same
    values, so the same bits as gathering first); an index outside the row is a ValueError."""
    lib = lib or _LIB.get()
    dt = x.dtype
    n = x.shape[-1] if x.dim() else 0
    if not _applies(lib, x) or not 2 <= block <= MAX_BLOCK or block & (block - 1) or not 0 <= normal <= n or normal % block:
        return None
    if perm is not None:
        if perm.shape != (n,) or perm.dtype != torch.int64 or perm.device != x.device:
            raise ValueError(f"block_hadamard: perm must be int64 [{n}] on {x.device}, got {perm.dtype} {tuple(perm.shape)}")
        perm = perm.contiguous()
    x2 = _rows(x, n)
    y = torch.empty(x.shape, dtype=dt)
    if x2.numel():
        if lib.block_hadamard(x2.data_ptr(), dt is _BF16, x2.shape[0], n, x2.stride(0), normal, block, inverse_sqrt_f32(block),
                              y.data_ptr(), None if perm is None else perm.data_ptr(), torch.get_num_threads()):
            raise ValueError(f"block_hadamard: the C kernel refused normal={normal}, block={block}, n={n}"
                             + ("" if perm is None else " or a perm index outside the row"))
    return y


def input_hadamard_reference(x: torch.Tensor) -> torch.Tensor:
    """The torch formulation: ``fast_transform`` of the whole row (in float32 for narrower
    inputs), one cast back to x's dtype."""
    from lowbit.formats.hadamard import fast_transform

    if x.dtype in (torch.float32, torch.float64):
        return fast_transform(x)
    return fast_transform(x.float()).to(x.dtype)


@functools.lru_cache(maxsize=None)
def _small_signs(m: int) -> torch.Tensor:
    from lowbit.formats.hadamard import hadamard_matrix

    return hadamard_matrix(m).to(torch.float32).contiguous()


def input_hadamard(x: torch.Tensor, lib=None) -> torch.Tensor | None:
    """:func:`input_hadamard_reference` in one call (float32 or bfloat16 on CPU, no autograd), or
    None where it does not apply. An order with no Hadamard matrix raises ``HadamardSizeError``."""
    from lowbit.formats.hadamard import factor

    lib = lib or _LIB.get()
    if not _applies(lib, x) or x.shape[-1] == 0:
        return None
    n = x.shape[-1]
    p, m = factor(n)
    x2 = _rows(x, n)
    y = torch.empty(x.shape, dtype=x.dtype)
    if x2.numel():
        signs = _small_signs(m)
        rc = lib.input_hadamard(x2.data_ptr(), x.dtype is _BF16, x2.shape[0], n, x2.stride(0), p, m, signs.data_ptr(),
                                inverse_sqrt_f32(n), y.data_ptr())
        if rc:
            raise (MemoryError if rc == -2 else ValueError)(f"input_hadamard: the C kernel refused n={n} = {p}·{m} ({rc})")
    return y
