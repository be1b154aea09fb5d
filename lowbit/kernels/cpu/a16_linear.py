"""Calling one native A16 linear (``w4_linear`` / ``w8_linear`` in ``csrc``): what both share,
including the deep copy of their prepared weights (which cache raw pointers).

The C side takes float32 or bfloat16 rows as they are and writes the output in the same dtype,
so a decode step pays one Python→C crossing per linear and no conversion passes.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Callable

import torch


def check_input(x, n_in: int, what: str) -> None:
    """ValueError unless ``x`` is a CPU tensor ``[..., n_in]``."""
    if not isinstance(x, torch.Tensor) or x.dim() == 0 or x.shape[-1] != n_in or not x.is_cpu:
        got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"{what}: needs a CPU tensor [..., {n_in}], got {got}")


def call(c_fn: Callable[..., int], weight_args: tuple, n_in: int, out_pad: int, out: int,
         bias: torch.Tensor | None, x: torch.Tensor, what: str) -> torch.Tensor:
    """``x [..., n_in]`` (float32 or bfloat16; others are converted to float32) → ``[..., out]``
    of x's dtype; ``weight_args`` are the kernel's leading (weight) arguments. ValueError when
    x's last dimension is not ``n_in`` (the kernel would read and write past the buffers)."""
    check_input(x, n_in, what)
    if x.dtype != torch.bfloat16 and x.dtype != torch.float32:
        x = x.float()
    x = x.contiguous()
    bf16 = int(x.dtype == torch.bfloat16)
    y = torch.empty(*x.shape[:-1], out_pad, dtype=x.dtype)
    if c_fn(*weight_args, x.data_ptr(), bf16, x.numel() // n_in, y.data_ptr(), bf16, torch.get_num_threads()):
        raise MemoryError(f"{what}: out of memory for its activation buffers")
    if out_pad != out:
        y = y[..., :out]
    return y + bias.to(y.dtype) if bias is not None else y


def copy_prepared(obj, memo: dict):
    """A deep copy of a prepared-weights dataclass, rebuilt through ``__init__`` so that its cached
    raw pointers (``args``) point at the copied tensors, never at the original's."""
    return type(obj)(**{f.name: copy.deepcopy(getattr(obj, f.name), memo) for f in dataclasses.fields(obj)})
