"""``rotation.block``: a Hadamard inside each INT4 block of a linear's normal channels, after the
outlier permutation, applied online in the packed linear (:class:`~lowbit.nn.online_hadamard.BlockHadamard`).

Atom's INT8 channels take out the few huge input channels; a whole-input rotation (R1, R4)
spreads them back over every INT4 group. Rotating only inside the blocks of what is left flattens
each group without touching the outliers (README, rotation: activation error of down_proj 0.038
→ 0.020). The weights hold ``W B`` and GPTQ's Hessian becomes ``Bᵀ XᵀX B`` for the rotated
inputs ``X B``, so no new calibration pass is needed.
"""

from __future__ import annotations

import torch

from lowbit.formats.scheme import RotationArgs
from lowbit.nn.online_hadamard import BlockHadamard


def block_rotate(weights: list[torch.Tensor], xtx: list[torch.Tensor], k: int, args: RotationArgs
                 ) -> tuple[list[torch.Tensor], list[torch.Tensor], BlockHadamard | None]:
    """``weights`` and ``xtx`` (permuted, outliers last) rotated by the block Hadamard, and the
    transform for the packed linears (None: ``rotation.block`` off, or no block of 2+ divides
    the normal channels)."""
    if not args.block:
        return weights, xtx, None
    n_in = weights[0].shape[1]
    normal = n_in - k
    b = BlockHadamard.block_for(normal, args.block)
    if b < 2:
        return weights, xtx, None
    t = BlockHadamard(n_in, normal, b)
    weights = [t(w.double()).to(w.dtype) for w in weights]
    xtx = [t(t(h.double()).T).T.to(h.dtype) for h in xtx]
    return weights, xtx, t
