"""An online Hadamard on a linear's input (QuaRot's R4 at down_proj): ``x → x H / √n`` at run
time, the weight holding ``W H / √n`` so the product is unchanged.

down_proj reads ``act(gate) ⊙ up``, a nonlinear product no offline rotation can reach, and it is
where the largest activation outliers of a SwiGLU model live. Rotating it online spreads them
before the activation quantizer sees them.

:class:`InputHadamard` is the transform (no tensors: the plain Hadamard of order ``n``, any
random signs already folded into the producer's weights); it is saved as a small dict in a
packed linear's layout. :class:`HadamardInputLinear` is the float linear the quantizer
calibrates: it rotates its input in a forward *pre*-hook, so forward hooks (the calibration
statistics) see the rotated input that the activation quantizer will see.
"""

from __future__ import annotations

import torch
from torch import nn

from lowbit.errors import LowbitError
from lowbit.formats.hadamard import factor, fast_transform

KIND = "hadamard"


class OnlineTransformError(LowbitError, ValueError):
    """An online transform description that cannot be built (unknown kind, bad order)."""


class InputHadamard(nn.Module):
    """``x → x H / √n`` on the last dimension by the fast transform (in float32 for narrower inputs)."""

    def __init__(self, n: int):
        super().__init__()
        factor(n)  # HadamardSizeError for an order with no known matrix
        self.n = n

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.n:
            raise OnlineTransformError(f"online Hadamard of order {self.n} got an input of width {x.shape[-1]}")
        if x.dtype in (torch.float32, torch.float64):
            return fast_transform(x)
        return fast_transform(x.float()).to(x.dtype)

    def to_dict(self) -> dict:
        return {"kind": KIND, "n": self.n}

    @classmethod
    def from_dict(cls, d: dict) -> "InputHadamard":
        if not isinstance(d, dict) or d.get("kind") != KIND or set(d) != {"kind", "n"}:
            raise OnlineTransformError(f"unknown online input transform {d!r}; known: {{'kind': '{KIND}', 'n': N}}")
        n = d["n"]
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise OnlineTransformError(f"online Hadamard order must be a positive integer, got {n!r}")
        return cls(n)

    def extra_repr(self) -> str:
        return f"n={self.n}"


def _rotate_input(module: nn.Module, args: tuple) -> tuple:
    return (module.input_transform(args[0]), *args[1:])


class HadamardInputLinear(nn.Linear):
    """A float linear computing ``(x H/√n) Wᵀ + b`` with ``W`` already rotated (same function as
    the original linear before rotation)."""

    def __init__(self, linear: nn.Linear):
        super().__init__(linear.in_features, linear.out_features, bias=linear.bias is not None, device="meta")
        self.weight = linear.weight
        self.bias = linear.bias
        self.input_transform = InputHadamard(linear.in_features)
        self.register_forward_pre_hook(_rotate_input)


def carry_input_transform(float_linear: nn.Module, packed: nn.Module) -> None:
    """Give the packed replacement of ``float_linear`` its online input transform, if it has one."""
    t = getattr(float_linear, "input_transform", None)
    if t is not None:
        packed.with_input_transform(t)
