"""Kernels: reference (PyTorch), CPU fast paths and Triton. Algorithms call these, never raw kernels.

``params.from_quant_linear(ql)`` → plain tensors; ``dispatch.prepare(params, device, kernel)``
→ a callable on the chosen kernel; ``module.accelerate(model)`` swaps QuantLinears for it;
``native_ops.use_native_ops(model)`` runs a model's norms, rotary embedding and decode attention
as single native calls (any format, float ones included).
"""

from .act_quant import IntActivation, quantize_tokens
from .dispatch import CHOICES, PreparedLinear, choose, linear, prepare
from .module import KernelLinear, accelerate
from .params import KINDS, ActSpec, KernelError, LinearParams, from_float, from_quant_linear

__all__ = ["IntActivation", "quantize_tokens", "CHOICES", "PreparedLinear", "choose", "linear", "prepare",
           "KernelLinear", "accelerate", "KINDS", "ActSpec", "KernelError", "LinearParams", "from_float",
           "from_quant_linear"]
