"""The output projection (``lm_head``) quantized per output row: by GPTQ on the final norm's
outputs when the scheme runs GPTQ and calibration text is at hand, else by RTN.

At batch 1 the default model's head (49152 x 576, tied to the embedding) is the largest single
matrix a decode step reads: 57 MB in bf16. INT8 per row costs +0.26 % perplexity on the default
model's w4a16 (38.78 → 38.88, README); INT4 g128 cost +20 %, so the presets keep the head at 8 bits
(as llama.cpp keeps ``output.weight`` at 6-8 bits). A tied head is untied: the embedding stays
float for the lookup, the config says ``tie_word_embeddings: false`` so a saved checkpoint
reloads the quantized head instead of re-tying it.

GPTQ's Hessian is ``XᵀX`` of what the head reads: the final norm applied to the last decoder
layer's outputs of the *quantized* layers, as the decoder's own linears are calibrated.
"""

from __future__ import annotations

import torch
from torch import nn

from lowbit.nn.quant_linear import QuantLinear

from lowbit.formats.scheme import GPTQArgs, WeightArgs
from lowbit.formats.quantized_weight import rtn

from .weights import gptq


def head_hessian(norm: nn.Module, hidden: list[torch.Tensor]) -> torch.Tensor:
    """``XᵀX`` (float32, summed over tokens) of ``norm(h)`` for the last layer's outputs ``hidden``."""
    xtx = None
    with torch.no_grad():
        for h in hidden:
            x = norm(h).reshape(-1, h.shape[-1]).float()
            xtx = x.T @ x if xtx is None else xtx.addmm_(x.T, x)
    if xtx is None:
        raise ValueError("the LM head's Hessian needs calibration outputs of the last layer, got none")
    return xtx


def quantize_head(model: nn.Module, args: WeightArgs, xtx: torch.Tensor | None = None,
                  gargs: GPTQArgs | None = None) -> QuantLinear:
    """Replace the head by a QuantLinear: GPTQ with ``xtx`` (the head's input ``XᵀX``) and
    ``gargs`` when both are given, RTN otherwise."""
    head = model.get_output_embeddings()
    if isinstance(head, QuantLinear):
        raise ValueError("the model's lm_head is already quantized")
    if not isinstance(head, nn.Linear):
        raise ValueError(f"lm_head quantization needs an nn.Linear head, got {type(head).__name__}")
    w = head.weight.detach().float()
    if (xtx is None) != (gargs is None):
        raise ValueError("GPTQ of the LM head needs both its Hessian and the GPTQ arguments")
    qw = rtn(w, args) if xtx is None else gptq(w, xtx.to(w.device), args, gargs)
    new = QuantLinear.from_quantized(qw, None, None, head.bias, "int8")
    model.set_output_embeddings(new)
    if getattr(model.config, "tie_word_embeddings", False):
        model.config.tie_word_embeddings = False
    return new
