"""compressed-tensors' ``pack-quantized`` tensors of one lowbit linear (weight-only INT).

Layout: :mod:`lowbit.formats.int32_words` (compressed-tensors 0.17's ``pack_to_int32``); the stored value is the
signed code plus ``2**(bits-1)``, which is exactly lowbit's unsigned code (symmetric codes carry
that offset already; asymmetric ones are ``q`` with ``(q - z)``). Zero points are packed the same
way along the output dim. Scales go out as float32 holding lowbit's FP16 values, so
``(q - z) * s`` is computed as lowbit computes it.
"""

from __future__ import annotations

import torch

from lowbit.formats import unpack
from lowbit.formats.int32_words import pack_int32


def pack_quantized_tensors(m) -> dict[str, torch.Tensor]:
    l = m.layout
    codes = unpack(m.qweight, l.w_bits, l.in_features)
    out = {"weight_packed": pack_int32(codes, l.w_bits),
           "weight_scale": m.wscale.float().contiguous(),
           "weight_shape": torch.tensor([l.out_features, l.in_features], dtype=torch.int64)}
    if m.wzero is not None:
        out["weight_zero_point"] = pack_int32(m.wzero, l.w_bits, dim=0)
    return out
