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
from lowbit.formats.hadamard import factor
from lowbit.kernels.channel_order import permute_channels
from lowbit.kernels.cpu.hadamard import block_hadamard, block_hadamard_reference, input_hadamard, input_hadamard_reference
from lowbit.kernels import triton as triton_backend
from lowbit.kernels.triton import hadamard as triton_hadamard

KIND = "hadamard"
BLOCK_KIND = "block-hadamard"


class OnlineTransformError(LowbitError, ValueError):
    """An online transform description that cannot be built (unknown kind, bad order)."""


class InputHadamard(nn.Module):
    """``x → x H / √n`` on the last dimension by the fast transform (in float32 for narrower
    inputs): Triton on CUDA, one C call on CPU, the torch formulation elsewhere; the same bits."""

    before_perm = True  # runs on the input as it arrives, before the outlier permutation

    def __init__(self, n: int):
        super().__init__()
        factor(n)  # HadamardSizeError for an order with no known matrix
        self.n = n

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.n:
            raise OnlineTransformError(f"online Hadamard of order {self.n} got an input of width {x.shape[-1]}")
        if x.is_cuda and triton_backend.available() and triton_hadamard.input_fits(self.n):
            return triton_hadamard.input_hadamard_triton(x)  # the same bits
        y = input_hadamard(x)  # one C call on CPU, the same bits
        return input_hadamard_reference(x) if y is None else y

    def to_dict(self) -> dict:
        return {"kind": KIND, "n": self.n}

    @classmethod
    def from_dict(cls, d: dict) -> "InputHadamard":
        _check_dict(d, KIND, ("n",))
        return cls(d["n"])

    def extra_repr(self) -> str:
        return f"n={self.n}"


class BlockHadamard(nn.Module):
    """After the outlier permutation: ``x[:, :normal]`` rotated by a Hadamard inside each block of
    ``block`` channels, the trailing outlier channels untouched. The rotation stays inside INT4
    groups and never mixes the INT8 outliers into them (a whole-input rotation does, and spreads
    their energy over every group)."""

    before_perm = False

    def __init__(self, n: int, normal: int, block: int):
        super().__init__()
        if not 0 < block <= normal <= n or normal % block or block & (block - 1):
            raise OnlineTransformError(f"block Hadamard needs a power-of-two block dividing the {normal} normal "
                                       f"channels of {n}, got block {block}")
        self.n, self.normal, self.block = n, normal, block

    def forward(self, x: torch.Tensor, perm: torch.Tensor | None = None) -> torch.Tensor:
        """The transform of ``x``, or with ``perm`` (the outlier reorder before it) of ``x[..., perm]``:
        on CPU the C call gathers in the same pass."""
        if x.shape[-1] != self.n:
            raise OnlineTransformError(f"block Hadamard of width {self.n} got an input of width {x.shape[-1]}")
        if perm is not None:
            y = block_hadamard(x, self.normal, self.block, perm=perm.to(torch.int64))  # None off the CPU
            if y is not None:
                return y
            x = permute_channels(x, perm)
        if x.is_cuda and triton_backend.available() and self.block <= triton_hadamard.MAX_BLOCK:
            return triton_hadamard.block_hadamard_triton(x, self.normal, self.block)  # the same bits
        y = block_hadamard(x, self.normal, self.block)  # one C call on CPU, the same bits
        return block_hadamard_reference(x, self.normal, self.block) if y is None else y

    def to_dict(self) -> dict:
        return {"kind": BLOCK_KIND, "n": self.n, "normal": self.normal, "block": self.block}

    @classmethod
    def from_dict(cls, d: dict) -> "BlockHadamard":
        _check_dict(d, BLOCK_KIND, ("n", "normal", "block"))
        return cls(d["n"], d["normal"], d["block"])

    def extra_repr(self) -> str:
        return f"n={self.n}, normal={self.normal}, block={self.block}"

    @staticmethod
    def block_for(normal: int, largest: int) -> int:
        """The largest power of two ≤ ``largest`` dividing ``normal`` (1: no useful block)."""
        b = 1
        while b * 2 <= largest and normal % (b * 2) == 0:
            b *= 2
        return b


def _check_dict(d, kind: str, ints: tuple[str, ...]) -> None:
    if not isinstance(d, dict) or d.get("kind") != kind or set(d) != {"kind", *ints}:
        raise OnlineTransformError(f"unknown online input transform {d!r}; known kinds: {KIND} (n), "
                                   f"{BLOCK_KIND} (n, normal, block)")
    for k in ints:
        v = d[k]
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise OnlineTransformError(f"online transform field {k!r} must be a positive integer, got {v!r}")


def transform_from_dict(d: dict) -> nn.Module:
    """The online transform a packed linear's layout describes."""
    kind = d.get("kind") if isinstance(d, dict) else None
    return BlockHadamard.from_dict(d) if kind == BLOCK_KIND else InputHadamard.from_dict(d)


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
