"""A tiny quantized checkpoint saved once per test module, with the logits it must reproduce."""

import torch

from lowbit.checkpoint import save_quantized
from tests.tiny_models import tiny_model
from lowbit.quantize import get_scheme, quantize_model

IDS = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))


def save_tiny(tmp_path_factory, scheme: str, name: str):
    """(checkpoint folder, logits of the quantized model on IDS) for a tiny Llama quantized with ``scheme``."""
    model = tiny_model("llama")
    quantize_model(model, get_scheme(scheme), IDS, progress=False)
    out = tmp_path_factory.mktemp(name) / "q"
    save_quantized(model, out)
    with torch.no_grad():
        return out, model(IDS).logits
