"""Layer-by-layer calibration: capture the inputs of decoder layer 0 once, then push the
calibration activations through one layer at a time (peak memory ≈ one layer + activations).

For each linear the hooks accumulate ``XᵀX`` (GPTQ's Hessian; its diagonal is the channel
square-sum that picks outlier channels), the token count and the per-channel max |x|
(SmoothQuant).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


class _StopForward(Exception):
    pass


@dataclass
class InputStats:
    xtx: torch.Tensor  # [in, in] float32, sum over tokens
    amax: torch.Tensor  # [in]
    n: int = 0


def capture_layer_inputs(model: nn.Module, layers: nn.ModuleList, ids: torch.Tensor, device: str,
                         batch_size: int = 1) -> tuple[list[torch.Tensor], dict]:
    """Hidden states entering ``layers[0]`` (one tensor per batch) and the keyword arguments the
    model passes every layer (mask, position embeddings), captured by a hook that stops the forward."""
    store: list[torch.Tensor] = []
    kw: dict = {}

    def hook(module, args, kwargs):
        store.append((args[0] if args else kwargs["hidden_states"]).detach())
        if not kw:
            kw.update({k: v for k, v in kwargs.items() if k != "hidden_states"})
        raise _StopForward

    handle = layers[0].register_forward_pre_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad():
            for i in range(0, ids.shape[0], batch_size):
                try:
                    model(ids[i:i + batch_size].to(device), use_cache=False)
                except _StopForward:
                    pass
    finally:
        handle.remove()
    kw["use_cache"] = False
    kw.pop("cache", None)
    kw.pop("past_key_values", None)
    return store, kw


def collect_stats(layer: nn.Module, names: list[str], inputs: list[torch.Tensor], kwargs: dict) -> dict[str, InputStats]:
    """Run the layer on every batch and accumulate input statistics of the named linears."""
    stats: dict[str, InputStats] = {}
    handles = []
    for name in names:
        mod = layer.get_submodule(name)
        stats[name] = InputStats(torch.zeros(mod.in_features, mod.in_features, device=mod.weight.device),
                                 torch.zeros(mod.in_features, device=mod.weight.device))

        def hook(module, args, _out, s=stats[name]):
            x = args[0].reshape(-1, args[0].shape[-1]).float()
            s.xtx += x.t() @ x
            s.amax = torch.maximum(s.amax, x.abs().amax(dim=0)) if x.numel() else s.amax
            s.n += x.shape[0]

        handles.append(mod.register_forward_hook(hook))
    try:
        run_layer(layer, inputs, kwargs)
    finally:
        for h in handles:
            h.remove()
    return stats


def run_layer(layer: nn.Module, inputs: list[torch.Tensor], kwargs: dict, make_cache=None) -> list[torch.Tensor]:
    """The layer's outputs for every batch; ``make_cache()`` gives a fresh KV cache per batch."""
    outs = []
    with torch.no_grad():
        for x in inputs:
            kw = dict(kwargs)
            if make_cache is not None:
                kw["cache"] = make_cache()
            y = layer(x, **kw)
            outs.append(y[0] if isinstance(y, tuple) else y)
    return outs
