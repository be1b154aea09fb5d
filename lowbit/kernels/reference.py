"""Reference paths: quantize the activations (if the kind does), dequantize the weight, matmul
in float32. Every fast kernel is tested against these. ``integer_reference`` is the same
product computed from the integer codes in float64 (exact group products, one rounding per
rescale), the yardstick for integer kernels whose only error is float32 rescaling."""

from __future__ import annotations

import torch

from lowbit.formats.grid import dequantize_groups, to_groups
from lowbit.formats.quantized_weight import dequantize_outliers
from lowbit.kernels.token_codes import IntActivation, quantize_tokens
from lowbit.kernels.linear_params import LinearParams


def dequantize_activation(a: IntActivation, group: int) -> torch.Tensor:
    normal = dequantize_groups(a.codes, a.scale, None, group)
    return torch.cat([normal, dequantize_outliers(a.outlier, a.outlier_scale)], dim=1)


def linear(x: torch.Tensor, p: LinearParams) -> torch.Tensor:
    """``x [t, in]`` → ``[t, out]`` float32, the simplest correct computation."""
    xf = x.float()
    if p.act is not None:
        xf = dequantize_activation(quantize_tokens(xf, p.act, p.n_outliers), p.act.group)
    y = xf @ p.dequantize().t()
    return y + p.bias if p.bias is not None else y


def integer_reference(x: torch.Tensor, p: LinearParams) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, magnitude) in float64 for integer-activation kinds: ``y = Σ_groups a_s·w_s·P_g`` with
    exact integer group products ``P_g``, and ``Σ |a_s·w_s·P_g|`` (for rounding bounds)."""
    if p.act is None or p.zero is not None:
        raise ValueError("integer_reference needs integer activations and symmetric weights")
    a = quantize_tokens(x.float(), p.act, p.n_outliers)
    t, n = a.codes.shape
    g = p.act.group or n
    ng = p.scale.shape[1]
    ac = to_groups(a.codes.double(), g).reshape(t, ng, g)
    wc = to_groups(p.codes.double(), g).reshape(-1, ng, g)
    prod = torch.einsum("tgj,ogj->tog", ac, wc)  # exact: integers well below 2^53
    terms = prod * a.scale.double()[:, None, :] * p.scale.double()[None, :, :]
    o = (a.outlier.double() @ p.outlier.double().t()) * a.outlier_scale.double()[:, None] * p.outlier_scale.double()[None, :]
    y = terms.sum(-1) + o
    mag = terms.abs().sum(-1) + o.abs()
    if p.bias is not None:
        y = y + p.bias.double()
        mag = mag + p.bias.double().abs()
    return y, mag
