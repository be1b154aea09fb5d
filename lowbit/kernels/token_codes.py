"""Dynamic per-token activation quantization for the integer kernels (plain torch, any device).

The formats' signed-absmax rule (:mod:`lowbit.formats.absmax`) and group view, the same
arithmetic as :func:`lowbit.nn.quantized_activation.quantize_activation` for symmetric INT grids
(scale = the group's signed absmax times ``clip`` over ``-2^(b-1)``, or compressed-tensors' absmax
over ``(2^b - 1) / 2`` by ``act.scale_rule``; zero scales become 1, round half to even, clamp; the
outliers always on the signed rule), but returns *signed* int8 codes and ``[tokens, groups]`` scales,
which is what integer matmuls consume. Tested equal to the module's version.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lowbit.formats.absmax import nonzero_scale, rule_scale
from lowbit.formats.grid import from_groups, n_groups, to_groups
from lowbit.kernels.linear_params import ActSpec, NonFiniteActivations


@dataclass
class IntActivation:
    codes: torch.Tensor  # int8 [t, n_normal]
    scale: torch.Tensor  # float32 [t, n_groups]
    outlier: torch.Tensor  # int8 [t, k]
    outlier_scale: torch.Tensor  # float32 [t]


def _symmetric(blocks: torch.Tensor, bits: int, clip: float, rule: str = "signed") -> tuple[torch.Tensor, torch.Tensor]:
    """``blocks [..., L]`` float32 → (int8 codes, float32 scale [...])."""
    if blocks.shape[-1] == 0:
        return blocks.to(torch.int8), blocks.new_ones(blocks.shape[:-1])
    scale = nonzero_scale(rule_scale(blocks, bits, clip, rule))
    q = torch.round(blocks / scale.unsqueeze(-1)).clamp_(-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    return q.to(torch.int8), scale


def quantize_tokens(x: torch.Tensor, act: ActSpec, n_outliers: int = 0) -> IntActivation:
    """``x [t, in]`` (outlier channels last) → integer codes and scales."""
    if x.dim() != 2:
        raise ValueError(f"activations must be [tokens, features], got {tuple(x.shape)}")
    if not x.is_floating_point():
        raise TypeError(f"activations must be floating point, got {x.dtype}")
    x = x.float()
    if not bool(torch.isfinite(x).all()):
        raise NonFiniteActivations()
    t, n_in = x.shape
    n = n_in - n_outliers
    if n < 0:
        raise ValueError(f"{n_outliers} outlier channels but only {n_in} features")
    if n:
        codes, scale = _symmetric(to_groups(x[:, :n], act.group), act.bits, act.clip, act.scale_rule)
        codes, scale = from_groups(codes, t, n), scale.reshape(t, n_groups(n, act.group))
    else:
        codes, scale = x.new_zeros(t, 0, dtype=torch.int8), x.new_zeros(t, 0)
    oc, os_ = _symmetric(x[:, n:], 8, 1.0)
    return IntActivation(codes, scale, oc, os_)
