"""compressed-tensors' ``int-quantized`` tensors of one lowbit linear (INT weights with quantized
input activations, e.g. W8A8): the weight as int8 signed codes (lowbit's unsigned code minus
``2**(bits-1)``), float32 scales holding lowbit's FP16 values, int8 zero points when asymmetric
(shifted the same way, so ``q - z`` is unchanged)."""

from __future__ import annotations

import torch

from lowbit.formats import unpack


def int_quantized_tensors(m) -> dict[str, torch.Tensor]:
    l = m.layout
    offset = 2 ** (l.w_bits - 1)
    codes = unpack(m.qweight, l.w_bits, l.in_features).to(torch.int16)
    out = {"weight": (codes - offset).to(torch.int8).contiguous(), "weight_scale": m.wscale.float().contiguous()}
    if m.wzero is not None:
        out["weight_zero_point"] = (m.wzero.to(torch.int16) - offset).to(torch.int8).contiguous()
    return out
