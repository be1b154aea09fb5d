"""Models whose tensors stay on disk until needed.

``meta_model`` builds the module tree without memory; ``materialize_rest`` loads what is still
missing (embeddings, norms, head, permutations) and rebuilds non-persistent buffers. A
tensor-parallel rank fills its own slices first; quantizing from disk (:func:`open_from_disk`)
loads one decoder layer at a time with ``load_layer``, so peak memory is the embeddings plus one
float layer plus the already-quantized layers, whatever the model's size.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from lowbit.io.safetensors_reader import CheckpointReader

from .module_paths import set_path


def meta_model(config, dtype: torch.dtype) -> nn.Module:
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, dtype=dtype)


def _set_tensor(model: nn.Module, name: str, value: torch.Tensor) -> None:
    mod_name, _, attr = name.rpartition(".")
    mod = model.get_submodule(mod_name)
    if attr in mod._buffers:
        mod._buffers[attr] = value
    else:
        setattr(mod, attr, nn.Parameter(value, requires_grad=False))


def _read(reader: CheckpointReader, name: str, dtype: torch.dtype) -> torch.Tensor:
    v = reader.full(name)
    return v.to(dtype).contiguous() if v.is_floating_point() else v.contiguous()


def materialize_rest(model: nn.Module, config, reader: CheckpointReader, dtype: torch.dtype, path,
                     skip: str | None = None) -> None:
    """Load every meta tensor (not under the prefix ``skip``) whole, re-tie a tied head, rebuild
    the non-persistent buffers; fail naming what the checkpoint lacks."""
    def wanted(n: str) -> bool:
        return skip is None or not n.startswith(skip)

    for name, t in list(model.named_parameters(remove_duplicate=False)) + list(model.named_buffers()):
        if t.is_meta and wanted(name) and name in reader:
            _set_tensor(model, name, _read(reader, name, dtype))
    head = model.get_output_embeddings()
    if getattr(head, "weight", None) is not None and head.weight.is_meta:  # tied head (a quantized one has no weight)
        head.weight = model.get_input_embeddings().weight
    # non-persistent buffers: rotary frequencies (rebuilt on the CPU) and Gemma's embedding scale
    for mod_name, mod in list(model.named_modules()):
        rotary = [b for n, b in mod.named_buffers(recurse=False) if n.endswith("inv_freq")]  # Gemma 3: one per layer type
        if rotary and any(b.is_meta for b in rotary) and wanted(mod_name):
            set_path(model, mod_name, type(mod)(config=config))
        if hasattr(mod, "scalar_embed_scale") and mod.embed_scale.is_meta:
            mod.embed_scale = torch.tensor(float(mod.scalar_embed_scale), dtype=dtype)
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta and wanted(n)]
    if left:
        raise ValueError(f"checkpoint {path} lacks tensors for: {', '.join(left[:5])}{' ...' if len(left) > 5 else ''}")


def load_layer(layer: nn.Module, prefix: str, reader: CheckpointReader, dtype: torch.dtype, device) -> None:
    """Give a meta decoder layer its weights from the checkpoint (``prefix``: ``model.layers.i.``)."""
    state = {}
    for name in layer.state_dict():
        if prefix + name not in reader:
            raise ValueError(f"checkpoint lacks {prefix + name}")
        state[name] = _read(reader, prefix + name, dtype).to(device)
    layer.load_state_dict(state, strict=True, assign=True)


def open_from_disk(path: str | Path, dtype: torch.dtype = torch.float32):
    """``(model, loader)``: the model with everything but its decoder layers loaded, and
    ``loader(i, layer, device)`` that loads layer ``i`` (for ``quantize_model(..., load_layer=)``)."""
    from transformers import AutoConfig

    from lowbit.models.adapters import get_adapter

    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"quantizing from disk needs a local safetensors checkpoint folder, got {path}")
    config = AutoConfig.from_pretrained(path)
    reader = CheckpointReader(path)
    model = meta_model(config, dtype)
    layers = get_adapter(model).layers(model)
    prefix = next(n for n, m in model.named_modules() if m is layers) + "."
    materialize_rest(model, config, reader, dtype, path, skip=prefix)
    model.eval()

    def loader(i: int, layer: nn.Module, device) -> None:
        load_layer(layer, f"{prefix}{i}.", reader, dtype, device)

    return model, loader
