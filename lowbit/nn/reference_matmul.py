"""The reference compute of a quantized linear: dequantize activations and weights, matmul.

This is deliberately the simplest correct path; a fused INT4 kernel (the kernels issue) must
match it. Kept in one function so that it can be swapped without touching the module.
"""

from __future__ import annotations

import torch

from lowbit.nn.quantized_activation import QuantizedActivation


def reference_quant_matmul(x: QuantizedActivation | torch.Tensor, w_dequant: torch.Tensor,
                           bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x`` (quantized, or float when activations stay float) times ``w_dequant``ᵀ, in float32."""
    xf = x.dequantize() if isinstance(x, QuantizedActivation) else x.float()
    y = xf @ w_dequant.t()
    if bias is not None:
        y = y + bias.float()
    return y
