"""Layer-by-layer calibration: capture the inputs of decoder layer 0 once, then push the
calibration activations through one layer at a time (peak memory ≈ one layer + activations).

For each linear the hooks accumulate ``XᵀX`` (GPTQ's Hessian; its diagonal is the channel
square-sum that picks outlier channels), the token count and the per-channel max |x|
(SmoothQuant). Linears that read one tensor (q/k/v, gate/up) share one accumulator, so the
``XᵀX`` product is paid once per input, not once per linear. With float targets, the hook also
accumulates ``X̃ᵀX``: the quantized model's inputs against the float model's inputs of the same
tokens (the cross term of the float-target least squares, see :mod:`lowbit.quantize.float_target`).
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
    cross: torch.Tensor | None = None  # [in, in] X̃ᵀX against float inputs (float targets only)


class _Catcher(nn.Module):
    """Stands in for a decoder layer while the model's forward runs: records what the model
    passes that layer and hands the hidden states on unchanged (nothing is computed)."""

    def __init__(self, index: int, record, last: bool):
        super().__init__()
        self.index, self.record, self.last = index, record, last

    def forward(self, *args, **kwargs):
        hidden = args[0] if args else kwargs["hidden_states"]
        self.record(self.index, hidden, kwargs)
        if self.last:
            raise _StopForward
        return hidden


def capture_layer_inputs(model: nn.Module, layers: nn.ModuleList, ids: torch.Tensor, device: str,
                         batch_size: int = 1) -> tuple[list[torch.Tensor], list[dict]]:
    """Hidden states entering ``layers[0]`` (one tensor per batch) and, for every layer, the
    keyword arguments the model passes it (mask, position embeddings: sliding-window and global
    layers get different ones, Gemma 3 even different rotary tables). The layers are replaced by
    stand-ins while this runs, so no layer computes anything."""
    store: list[torch.Tensor] = []
    per_layer: list[dict] = [{} for _ in layers]
    first = [True]

    def record(i: int, hidden: torch.Tensor, kwargs: dict) -> None:
        if i == 0:
            store.append(hidden.detach())
        if first[0]:
            per_layer[i] = {k: v for k, v in kwargs.items() if k != "hidden_states"}
        if i == 0 and not first[0]:
            raise _StopForward  # the other layers' arguments are known already

    originals = list(layers)
    for i in range(len(layers)):
        layers[i] = _Catcher(i, record, i == len(layers) - 1)
    try:
        with torch.no_grad():
            for b in range(0, ids.shape[0], batch_size):
                try:
                    model(ids[b:b + batch_size].to(device), use_cache=False)
                except _StopForward:
                    pass
                first[0] = False
    finally:
        for i, layer in enumerate(originals):
            layers[i] = layer
    for kw in per_layer:
        kw["use_cache"] = False
        kw.pop("cache", None)
        kw.pop("past_key_values", None)
    return store, per_layer


def _flat(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1]).float()


def capture_linear_inputs(layer: nn.Module, names: list[str], inputs: list[torch.Tensor], kwargs: dict,
                          stop_early: bool = True) -> dict[str, list[torch.Tensor]]:
    """The inputs (``[tokens, in]`` per batch) of the named linears; the forward stops as soon as
    all of them have run (the rest of the layer is not needed)."""
    got: dict[str, list[torch.Tensor]] = {n: [] for n in names}
    _run_hooked(layer, names, inputs, kwargs, lambda name, b, x: got[name].append(x.cpu()), stop_early)
    return got


def collect_stats(layer: nn.Module, names: list[str], inputs: list[torch.Tensor], kwargs: dict,
                  shared: list[list[str]] | None = None, targets: dict[str, list[torch.Tensor]] | None = None,
                  stop_early: bool = False, make_cache=None) -> dict[str, InputStats]:
    """Run the layer on every batch and accumulate input statistics of the named linears.

    ``shared``: lists of names that read the same tensor (one accumulator for each list; only
    its first name is hooked). ``targets``: per hooked name, the float model's inputs of every
    batch (from :func:`capture_linear_inputs`) for the cross term. ``stop_early``: abandon each
    batch's forward once all hooked linears ran (statistics of later linears are not needed).
    ``make_cache``: as in :func:`run_layer` (a quantized KV cache changes o_proj's inputs)."""
    alias: dict[str, str] = {n: n for n in names}
    for grp in shared or []:
        for n in grp:
            alias[n] = grp[0]
    hooked = list(dict.fromkeys(alias[n] for n in names))
    own: dict[str, InputStats] = {}
    for name in hooked:
        mod = layer.get_submodule(name)
        n_in = mod.in_features
        dev = mod.weight.device
        own[name] = InputStats(torch.zeros(n_in, n_in, device=dev), torch.zeros(n_in, device=dev),
                               cross=torch.zeros(n_in, n_in, device=dev) if targets is not None else None)

    def add(name: str, b: int, x: torch.Tensor) -> None:
        s = own[name]
        s.xtx += x.t() @ x
        if x.numel():
            s.amax = torch.maximum(s.amax, x.abs().amax(dim=0))
        s.n += x.shape[0]
        if targets is not None:
            t = targets[name][b].to(x.device)
            if t.shape != x.shape:
                raise ValueError(f"{name}: float inputs {tuple(t.shape)} do not match quantized inputs {tuple(x.shape)}")
            s.cross += x.t() @ t

    _run_hooked(layer, hooked, inputs, kwargs, add, stop_early, make_cache)
    return {n: own[alias[n]] for n in names}


def _run_hooked(layer: nn.Module, names: list[str], inputs: list[torch.Tensor], kwargs: dict, fn,
                stop_early: bool, make_cache=None) -> None:
    """Call ``fn(name, batch_index, x)`` with each named linear's flattened float input."""
    fired: set[str] = set()
    batch = [0]
    handles = []
    for name in names:
        def hook(module, args, _out, name=name):
            fn(name, batch[0], _flat(args[0]))
            fired.add(name)
            if stop_early and len(fired) == len(names):
                raise _StopForward

        handles.append(layer.get_submodule(name).register_forward_hook(hook))
    try:
        with torch.no_grad():
            for b, x in enumerate(inputs):
                batch[0] = b
                fired.clear()
                kw = dict(kwargs)
                if make_cache is not None:
                    kw["cache"] = make_cache()
                try:
                    layer(x, **kw)
                except _StopForward:
                    pass
    finally:
        for h in handles:
            h.remove()


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
