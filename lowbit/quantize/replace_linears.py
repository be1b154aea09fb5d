"""The last step of a group: its float linears become packed :class:`QuantLinear` modules, from
GPTQ/RTN weights or (``permute_only``, activation-only schemes) from the float weights."""

from __future__ import annotations

import torch
from torch import nn

from lowbit.formats.scheme import Scheme
from lowbit.models.module_paths import set_path
from lowbit.nn.online_hadamard import carry_input_transform
from lowbit.nn.quant_linear import QuantLinear

from .block_rotation import block_rotate
from .recipe_steps import RecipeSteps
from .weights import quantize_weights


def replace_group_linears(layer: nn.Module, paths: list[str], linears: list[nn.Linear], weights: list[torch.Tensor],
                          xtx: list[torch.Tensor], scheme: Scheme, steps: RecipeSteps, k: int,
                          input_perm: torch.Tensor | None, shared_input: bool) -> None:
    """Replace ``layer.<paths[i]>`` by its QuantLinear. ``weights``: float weights with the
    permutation applied; ``xtx``: the matching (permuted) statistics for GPTQ; ``shared_input``:
    the linears read one input (one activation quantization)."""
    if not steps.replace_linears:
        return
    weights, xtx, block = block_rotate(weights, xtx, k, scheme.rotation)
    if steps.quantize_weights:
        quantized = quantize_weights(weights, xtx, scheme, k, shared_input=shared_input)
        new = [QuantLinear.from_quantized(qw, scheme.activations, input_perm, m.bias, scheme.outliers.precision)
               for m, qw in zip(linears, quantized)]
    else:
        new = [QuantLinear.from_float(w, steps.activations, input_perm, m.bias, k, scheme.outliers.precision)
               for m, w in zip(linears, weights)]
    for path, m, q in zip(paths, linears, new):
        carry_input_transform(m, q)
        if block is not None:
            q.with_input_transform(block)
        set_path(layer, path, q)
