"""The output projection (``lm_head``) quantized by RTN per output row.

At batch 1 the default model's head (49152 x 576, tied to the embedding) is the largest single
matrix a decode step reads: 57 MB in bf16. INT8 per row costs +0.26 % perplexity on the default
model's w4a16 (38.78 → 38.88, README); INT4 g128 cost +20 %, so the presets keep the head at 8 bits
(as llama.cpp keeps ``output.weight`` at 6-8 bits). A tied head is untied: the embedding stays
float for the lookup, the config says ``tie_word_embeddings: false`` so a saved checkpoint
reloads the quantized head instead of re-tying it.
"""

from __future__ import annotations

from torch import nn

from lowbit.nn.quant_linear import QuantLinear

from lowbit.formats.scheme import WeightArgs
from lowbit.formats.quantized_weight import rtn


def quantize_head(model: nn.Module, args: WeightArgs) -> QuantLinear:
    head = model.get_output_embeddings()
    if isinstance(head, QuantLinear):
        raise ValueError("the model's lm_head is already quantized")
    if not isinstance(head, nn.Linear):
        raise ValueError(f"lm_head quantization needs an nn.Linear head, got {type(head).__name__}")
    new = QuantLinear.from_quantized(rtn(head.weight.detach().float(), args), None, None, head.bias, "int8")
    model.set_output_embeddings(new)
    if getattr(model.config, "tie_word_embeddings", False):
        model.config.tie_word_embeddings = False
    return new
