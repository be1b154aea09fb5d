"""Two experimental placements of a Hadamard that the README's rotation ablation measures and
lowbit does not ship (``ablation.py --variant``): monkeypatches on a loaded float model / the
quantizer, for measurement only.

* ``norm-output``: rotate each norm's *scaled* output online (``(x̂ ⊙ w) H``, readers ``W H``),
  instead of folding ``w`` into the readers and rotating the residual stream (R1). R2 and R4
  as in lowbit. Isolates what folding the norm scale costs.
* ``group-hadamard``: Atom's outlier permutation first, then a Hadamard inside each block of
  the normal (INT4) channels, online (128 where it divides them, else 64); weights and GPTQ
  Hessians transformed to match. Keeps the INT8 outliers out of the rotation.
"""

from __future__ import annotations

import torch
from torch import nn

from lowbit.formats.hadamard import fast_transform
from lowbit.formats.scheme import RotationArgs
from lowbit.models.adapters import get_adapter
from lowbit.models.module_paths import get_path, set_path
from lowbit.nn.quantized_activation import quantize_activation
from lowbit.nn.reference_matmul import reference_quant_matmul
from lowbit.quantize import apply as quantize_apply
from lowbit.quantize import rotation


class RotatedNorm(nn.Module):
    def __init__(self, norm: nn.Module):
        super().__init__()
        self.norm = norm

    @property
    def weight(self):
        return self.norm.weight

    def forward(self, x):
        return fast_transform(self.norm(x))


def norm_output(model: nn.Module, r2: bool = True, r4: bool = True) -> None:
    adapter, args = get_adapter(model), RotationArgs(kind="hadamard")
    for layer in adapter.layers(model):
        for g in adapter.groups(layer):
            if g.norm is None:
                continue
            for p in g.linears:
                w = get_path(layer, p).weight
                with torch.no_grad():
                    w.copy_(fast_transform(w.detach().double()).to(w.dtype))
            set_path(layer, g.norm, RotatedNorm(get_path(layer, g.norm)))
        if r2:
            rotation._rotate_heads(layer.self_attn, rotation.Rotation(rotation.head_dim(model), args, 1))
    if r4:
        q4 = rotation._down_rotations(adapter.layers(model), adapter, args)
        for layer in adapter.layers(model):
            rotation._rotate_down_online(layer, adapter, q4)


def _block(n: int) -> int:
    return 128 if n % 128 == 0 else (64 if n % 64 == 0 else 0)


def _blocks(x: torch.Tensor, n: int, b: int) -> torch.Tensor:
    """Hadamard on each ``b``-block of the first ``n`` columns of ``x``."""
    head = fast_transform(x[..., :n].reshape(*x.shape[:-1], n // b, b)).reshape(*x.shape[:-1], n)
    return torch.cat([head, x[..., n:]], -1)


def group_hadamard() -> None:
    original = quantize_apply.replace_group_linears

    def patched(layer, paths, linears, weights, xtx, scheme, steps, k, input_perm, shared_input):
        n = weights[0].shape[1] - k
        b = _block(n)
        if b:
            weights = [_blocks(w.double(), n, b).float() for w in weights]
            xtx = [_blocks(_blocks(h.double(), n, b).T, n, b).T.float() for h in xtx]
        original(layer, paths, linears, weights, xtx, scheme, steps, k, input_perm, shared_input)
        if not b:
            return
        for p in paths:
            m = get_path(layer, p)

            def forward(x, m=m, n=n, b=b):
                shape = x.shape
                x2 = x.reshape(-1, shape[-1]).float()
                if m.input_perm is not None:
                    x2 = x2.index_select(1, m.input_perm)
                x2 = _blocks(x2, n, b)
                a = x2 if m.act_args is None else quantize_activation(x2, m.act_args, m.layout.n_outliers,
                                                                      m.layout.outlier_precision)
                return reference_quant_matmul(a, m.dequantized_weight(), m.bias).reshape(*shape[:-1], -1).to(x.dtype)

            m.forward = forward

    quantize_apply.replace_group_linears = patched
