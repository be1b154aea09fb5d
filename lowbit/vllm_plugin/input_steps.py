"""What a served linear does to its input before lowbit's kernel: the reorder (in the kernel, or
gathered first where an online transform must run after it) and the ``-rot`` presets' block
Hadamard, inside lowbit's op (:func:`lowbit.accelerate.online_input.input_steps` decides, as for
lowbit's own layers). Free of vLLM, so it is tested against lowbit's own layers without it."""

from __future__ import annotations

import functools
from typing import Callable

import torch
from torch import nn

from lowbit.accelerate.online_input import input_steps as steps_of, prepare_input


def input_steps(ql: nn.Module, folded: bool) -> tuple[torch.Tensor | None, Callable | None]:
    """``(the reorder the kernel reads x through, what the op applies to x first)`` for the packed
    linear ``ql``; ``folded``: the layer before already writes x in ``ql``'s input order."""
    in_kernel, outside, transform = steps_of(ql, folded)
    if transform is None:
        return in_kernel, None
    return in_kernel, functools.partial(prepare_input, perm=outside, transform=transform)
