"""Kernels: reference (PyTorch), CPU backends (``cpu/``, C sources in ``csrc/``) and Triton
(``triton/``). Algorithms call these through ``dispatch``, never a backend directly.

``linear_params.from_quant_linear(ql)`` → plain tensors; ``dispatch.prepare(params, device,
kernel)`` → a callable on the chosen kernel. Putting kernels into a model is lowbit.accelerate's job.
"""

from .dispatch import CHOICES, PreparedLinear, choose, linear, prepare
from .linear_params import KINDS, ActSpec, KernelError, LinearParams, from_float, from_quant_linear
from .token_codes import IntActivation, quantize_tokens

__all__ = ["IntActivation", "quantize_tokens", "CHOICES", "PreparedLinear", "choose", "linear", "prepare",
           "KINDS", "ActSpec", "KernelError", "LinearParams", "from_float", "from_quant_linear"]
