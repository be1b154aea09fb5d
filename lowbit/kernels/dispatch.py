"""Choose a kernel for a quantized linear by device and kind; ``LOWBIT_KERNEL`` or the
``kernel`` argument forces one (``reference`` | ``cpu`` | ``triton``), and a forced kernel that
cannot run here raises :class:`KernelError` saying why (never a silent fallback).

``auto``: CUDA tensors → Triton for W4A4 (others: reference until GPU kernels exist);
CPU tensors → the CPU fast path of the kind; anything else → reference.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any, Callable

import torch

from lowbit.kernels.cpu import a16_gemm, huge_pages, w4_gemv, w4a4, w4a16, w8_gemv, w8a8, w8a16
from lowbit.kernels import reference
from lowbit.kernels.channel_order import permute_channels
from lowbit.kernels import triton as triton_backend
from lowbit.kernels.triton import w4a4 as triton_w4a4
from lowbit.kernels.linear_params import KernelError, LinearParams

CHOICES = ("auto", "reference", "cpu", "triton")
_CPU = {"w4a16": w4a16, "w8a16": w8a16, "w8a8": w8a8, "w4a4": w4a4}
_TRITON = {"w4a4": triton_w4a4}


def requested(kernel: str | None = None) -> str:
    k = kernel or os.environ.get("LOWBIT_KERNEL", "auto") or "auto"
    if k not in CHOICES:
        raise KernelError(f"unknown kernel {k!r} (LOWBIT_KERNEL or argument); choose from {', '.join(CHOICES)}")
    return k


def choose(kind: str, device: torch.device | str, kernel: str | None = None) -> str:
    """The kernel that will run ``kind`` on ``device`` (``reference`` | ``cpu`` | ``triton``)."""
    dev = torch.device(device)
    k = requested(kernel)
    if k == "auto":
        if dev.type == "cuda" and kind in _TRITON and triton_backend.available():
            return "triton"
        if dev.type == "cpu" and kind in _CPU and _CPU[kind].available():
            return "cpu"
        return "reference"
    if k == "cpu":
        if dev.type != "cpu":
            raise KernelError(f"kernel 'cpu' forced but the tensors are on {dev}")
        if kind not in _CPU or not _CPU[kind].available():
            raise KernelError(f"no CPU fast path for {kind} in this torch build")
    if k == "triton":
        if kind not in _TRITON:
            raise KernelError(f"no Triton kernel for {kind} (Triton kernels: {', '.join(_TRITON)})")
        if not triton_backend.available():
            raise KernelError("kernel 'triton' forced but triton is not installed")
        if dev.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            raise KernelError(f"kernel 'triton' forced on {dev}: needs a CUDA device (or TRITON_INTERPRET=1 for tests)")
    return k


@dataclass
class PreparedLinear:
    """A linear ready for one kernel: ``__call__(x [t, in]) → [t, out]`` float32 (bfloat16 from the
    native W4A16 kernel given bfloat16 input: it converts inside, saving two passes per call).
    With ``input_perm`` (int64 ``[in]``) it computes the linear of ``x[..., input_perm]`` (a layer's
    input reorder); the native W4A4 kernel reads x through it, others gather first."""

    kind: str
    kernel: str
    state: Any
    fn: Callable[[torch.Tensor, Any], torch.Tensor]
    in_features: int
    out_features: int
    input_perm: torch.Tensor | None = None

    def __post_init__(self) -> None:
        perm = self.input_perm
        if perm is not None:
            if perm.shape != (self.in_features,) or perm.dtype.is_floating_point or perm.is_complex():
                raise ValueError(f"input_perm must be integer [{self.in_features}], got {perm.dtype} {tuple(perm.shape)}")
            if self.in_features and not (0 <= int(perm.min()) and int(perm.max()) < self.in_features):
                raise ValueError(f"input_perm holds indices outside [0, {self.in_features})")
            # a copy of its own: the native order below is planned from these values once, so an
            # edit of the caller's tensor must not reach __call__ (which gathers through this one)
            self.input_perm = perm.to(torch.int64, copy=True).contiguous()
        # the native kernels take [..., in] in float32 or bf16 as they are (one call, no reshapes)
        self._direct, self._gathers = None, False
        if self.kind in ("w4a16", "w8a16") and isinstance(self.state, a16_gemm.A16Panels):
            self._direct = a16_gemm.run
        elif self.kind == "w4a16" and isinstance(self.state, w4_gemv.W4GemvPrepared):
            self._direct = w4_gemv.run
        elif self.kind == "w8a16" and isinstance(self.state, w8_gemv.W8GemvPrepared):
            self._direct = w8_gemv.run
        elif self.kind == "w8a8" and getattr(self.state, "method", None) == "gemm":
            self._direct = w8a8.run_gemm
        elif self.kind == "w4a4" and isinstance(self.state, w4a4.W4A4GemmPrepared):
            order = None if self.input_perm is None else w4a4.input_order(self.input_perm)  # planned once
            self._direct, self._gathers = functools.partial(w4a4.run_gemm, perm=order), True

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2 or x.shape[1] != self.in_features:
            raise ValueError(f"{self.kind} linear expects [tokens, {self.in_features}] input, got {tuple(x.shape)}")
        if not x.is_floating_point():
            raise TypeError(f"activations must be floating point, got {x.dtype}")
        if self.input_perm is not None:
            x = permute_channels(x, self.input_perm)
        return self.fn(x, self.state)

    def batched(self, x: torch.Tensor) -> torch.Tensor:
        """``x [..., in]`` → ``[..., out]`` of x's dtype (what a module's forward returns)."""
        if x.dim() == 0 or x.shape[-1] != self.in_features:
            raise ValueError(f"{self.kind} linear expects [..., {self.in_features}] input, got {tuple(x.shape)}")
        if not x.is_floating_point():
            raise TypeError(f"activations must be floating point, got {x.dtype}")
        if self.input_perm is not None and not self._gathers:
            x = permute_channels(x, self.input_perm)
        if self._direct is not None:
            y = self._direct(x, self.state)
        else:
            y = self.fn(x.reshape(-1, self.in_features), self.state).reshape(*x.shape[:-1], self.out_features)
        return y if y.dtype == x.dtype else y.to(x.dtype)


def prepare(p: LinearParams, device: torch.device | str = "cpu", kernel: str | None = None,
            cpu_method: str | None = None, input_perm: torch.Tensor | None = None) -> PreparedLinear:
    """Convert ``p`` once into the layout the chosen kernel wants. ``cpu_method`` picks the CPU
    kernel: lowbit's batched ``gemm`` or its GEMV ``native`` (the default is the one that wins on
    this build, see each kind's module), or for W8A8/W4A4 the ``float`` / ``int_mm`` routes to the
    exact integer products, for W4A16 / W8A16 torch's ``int4pack`` / ``int8pack``. ``input_perm``:
    see :class:`PreparedLinear`."""
    p.check()  # sizes that disagree are an error here, never a read past a buffer later
    k = choose(p.kind, device, kernel)
    if k == "reference":
        return PreparedLinear(p.kind, k, p.to(device), reference.linear, p.in_features, p.out_features,
                              None if input_perm is None else input_perm.to(device))
    mod = _CPU[p.kind] if k == "cpu" else _TRITON[p.kind]
    if k == "triton":
        state = mod.prepare(p, device)
    elif cpu_method is not None and p.kind in ("w8a8", "w4a4", "w4a16", "w8a16"):
        state = mod.prepare(p, cpu_method)
        k = f"cpu:{cpu_method}"
    else:
        state = mod.prepare(p)
        k = f"cpu:{state.method}" if hasattr(state, "method") else k
    if k != "triton":
        state = huge_pages.relocate(state)  # the same bytes in 2 MiB pages: cold decode reads
    return PreparedLinear(p.kind, k, state, mod.run, p.in_features, p.out_features,
                          None if input_perm is None else input_perm.to(device))


def linear(x: torch.Tensor, p: LinearParams, kernel: str | None = None) -> torch.Tensor:
    """One-shot convenience (prepares every call: use :func:`prepare` in loops)."""
    return prepare(p, x.device, kernel)(x)
