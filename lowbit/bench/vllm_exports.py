"""The lowbit schemes that ``lowbit bench serve`` quantizes for vLLM's CPU build, and a
quantize-then-export helper.

vLLM 0.32's CPU kernels take W8A8 (INT8 weights per channel, dynamic per-token INT8 activations)
and W4A16 with whole groups; the default model's width 576 is no multiple of 128 (the w4a16
preset's group), so W4A16 exports with groups of 64. vLLM's CPU build serves only a float LM head
(the w4a16 preset's INT8 head is left float here), and so that every served format is compared on
the same head, W4A4's INT8 head is left float too; the ``-head8`` schemes keep the presets' INT8
head, for the plugin, which runs it on lowbit's W8A16 kernel. Speed does not depend on the weight values, so
RTN (no GPTQ) is used: it quantizes in seconds. W4A4 (the Atom preset: INT8 outlier channels,
reorder, groups of 128) has no compressed-tensors form vLLM runs; it is served through lowbit's
vLLM plugin only, from lowbit's own checkpoint folder.
"""

from __future__ import annotations

import copy
from pathlib import Path

VLLM_SCHEMES: dict[str, tuple[str, list[str]]] = {
    "w8a8": ("w8a8", ["lm_head.bits=16"]),
    "w4a16": ("w4a16", ["weights.group_size=64", "lm_head.bits=16", "gptq.enabled=false"]),
    "w4a4": ("w4a4", ["gptq.enabled=false", "weights.clip_search=false", "lm_head.bits=16"]),
    "w4a4-rot": ("w4a4-rot", ["gptq.enabled=false", "weights.clip_search=false", "lm_head.bits=16"]),
    # the presets' own INT8 head (per row; RTN here): served by the plugin only
    "w4a16-head8": ("w4a16", ["weights.group_size=64", "gptq.enabled=false"]),
    "w4a4-head8": ("w4a4", ["gptq.enabled=false", "weights.clip_search=false"]),
}


def vllm_scheme(fmt: str):
    from lowbit.quantize import get_scheme
    from lowbit.quantize.overrides import apply_overrides

    preset, sets = VLLM_SCHEMES[fmt]
    return apply_overrides(get_scheme(preset), sets)


def quantize_for_vllm(base, fmt: str, calib_ids):
    """A quantized copy of the float model ``base`` in the vLLM-servable version of ``fmt``."""
    from lowbit.quantize import quantize_model

    model = copy.deepcopy(base)
    quantize_model(model, vllm_scheme(fmt), calib_ids, progress=False)
    return model


def export_for_vllm(model, tokenizer, out: Path) -> Path:
    from lowbit.export import export_compressed_tensors

    return export_compressed_tensors(model, out, tokenizer)
