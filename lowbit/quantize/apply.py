"""``quantize_model(model, scheme, calib_ids)``: one call applies a scheme, layer by layer.

For every decoder layer: collect input statistics of its linears (float layer, inputs coming
from the already-quantized layers before it), fold smoothing scales and the outlier
permutation into the graph, quantize each linear (GPTQ or RTN) into a packed
:class:`~lowbit.nn.QuantLinear`, then run the *quantized* layer to make the next layer's inputs.

Options of GPTQ (both off in the presets; measured in the README): ``true_sequential`` collects
statistics stage by stage inside a layer (q/k/v, o_proj, gate/up, down_proj), each from the
already-quantized stages before it; ``float_target`` also runs a float copy of every layer on the
float model's own hidden states and aims each linear at the float outputs.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn
from tqdm.auto import tqdm

from lowbit.models.adapters import Adapter, InputGroup, get_adapter, get_path, set_path
from lowbit.nn.kv_cache import PackedKVCache, install_kv_quantization
from lowbit.nn.permuted_norm import PermutedNorm
from lowbit.nn.quant_linear import QuantLinear

from .calibrate import InputStats, capture_layer_inputs, capture_linear_inputs, collect_stats, run_layer
from .float_target import float_target_weight
from .head import quantize_head
from .outliers import outlier_permutation
from lowbit.formats.scheme import Scheme
from .smooth import fold_into_norm, smooth_scales
from .row_shards import quantize_row_sharded, tp_splits
from .weights import quantize_weights


@dataclass
class QuantizeReport:
    scheme: Scheme
    n_samples: int
    seqlen: int
    seconds: float
    layers: int
    permutations: dict[str, list[int]] = field(default_factory=dict)


def _check_ids(ids: torch.Tensor | None, needed: bool) -> None:
    if not needed:
        return
    if ids is None or not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.numel() == 0:
        raise ValueError("calibration ids must be a non-empty [n_samples, seqlen] integer tensor")
    if ids.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"calibration ids must be integer token ids, got {ids.dtype}")


def quantize_model(model: nn.Module, scheme: Scheme, calib_ids: torch.Tensor | None, *, device: str = "cpu",
                   batch_size: int = 1, progress: bool = True, permute_only: bool = False,
                   load_layer: Callable[[int, nn.Module, str], None] | None = None) -> QuantizeReport:
    """Quantize ``model`` in place. ``permute_only`` applies only the outlier reordering (float
    weights, no quantization): the result must compute the same function (a test checks it).

    ``load_layer(i, layer, device)``: the decoder layers are still on the meta device and this
    loads layer ``i`` when its turn comes (:func:`lowbit.models.lazy.open_from_disk`), so only one
    float layer is ever in memory."""
    from .rotation import rotate_model; rotate_model(model, scheme.rotation)  # noqa: E702 (float pre-pass, nothing if kind none)
    adapter = get_adapter(model)
    if load_layer is not None and adapter.is_moe:
        raise ValueError("quantizing from disk supports dense models; load a mixture-of-experts model whole")
    needs_linears = scheme.weights.enabled or scheme.activations.enabled or permute_only
    _check_ids(calib_ids, needs_linears)
    t0 = time.perf_counter()
    splits = tp_splits(model, scheme, adapter.is_moe)
    adapter.prepare(model)
    report = QuantizeReport(scheme, 0 if calib_ids is None else calib_ids.shape[0],
                            0 if calib_ids is None else calib_ids.shape[1], 0.0, 0)
    layers = adapter.layers(model)
    if needs_linears:
        orig_device = next(model.parameters()).device
        _to_device(model, device)
        inputs, kwargs = capture_layer_inputs(model, layers, calib_ids, device, batch_size)
        make_cache = None
        if scheme.kv_cache.enabled and not permute_only:
            make_cache = lambda: PackedKVCache(model.config, scheme.kv_cache.bits, scheme.kv_cache.symmetric)  # noqa: E731
        float_target = scheme.gptq.enabled and scheme.gptq.float_target and not permute_only
        if float_target and adapter.is_moe:
            raise ValueError("gptq.float_target needs the same tokens in the float and quantized model; "
                             "a mixture of experts routes them differently (use it on dense models)")
        finputs = inputs if float_target else None
        for i, layer in enumerate(tqdm(layers, desc=f"quantize {scheme.name}", disable=not progress)):
            if load_layer is not None:
                load_layer(i, layer, device)
            flayer = copy.deepcopy(layer) if float_target else None
            groups = adapter.groups(layer)
            sequential = scheme.gptq.enabled and scheme.gptq.true_sequential and not permute_only
            for stage in (_stages(groups) if sequential else [groups]):
                names = [n for g in stage for n in g.linears]
                shared = [g.linears for g in stage if g.norm is not None and not adapter.is_moe]
                targets = None
                if float_target:
                    heads = [g.linears[0] for g in stage]
                    targets = capture_linear_inputs(flayer, heads, finputs, kwargs)
                stats = collect_stats(layer, names, inputs, kwargs, shared=shared, targets=targets, stop_early=sequential,
                                      make_cache=make_cache if sequential else None)
                for g in stage:
                    perm = _quantize_group(layer, adapter, g, stats, scheme, permute_only, splits)
                    if perm is not None:
                        report.permutations[f"layers.{i}.{g.linears[0]}"] = perm.tolist()
                del stats, targets
            inputs = run_layer(layer, inputs, kwargs, make_cache)
            if float_target:
                finputs = run_layer(flayer, finputs, kwargs)
                del flayer
        model.to(orig_device)
        report.layers = len(layers)
    elif load_layer is not None:  # nothing to calibrate (a KV-cache-only scheme): just load the layers
        for i, layer in enumerate(layers):
            load_layer(i, layer, "cpu")
    if scheme.lm_head.enabled and not permute_only:
        quantize_head(model, scheme.lm_head)
    if scheme.kv_cache.enabled and not permute_only:
        install_kv_quantization(model, scheme.kv_cache.bits, scheme.kv_cache.symmetric)
    model.lowbit_scheme = scheme
    report.seconds = time.perf_counter() - t0
    return report


def _to_device(model: nn.Module, device: str) -> None:
    """``model.to(device)`` that leaves meta tensors (layers not loaded yet) alone and keeps
    tied parameters tied."""
    if not any(t.is_meta for t in model.parameters()):
        model.to(device)
        return
    moved: dict[int, torch.Tensor] = {}
    for mod in model.modules():
        for store in (mod._parameters, mod._buffers):
            for k, t in store.items():
                if t is None or t.is_meta:
                    continue
                if id(t) not in moved:
                    new = t.data.to(device)
                    moved[id(t)] = nn.Parameter(new, requires_grad=False) if isinstance(t, nn.Parameter) else new
                store[k] = moved[id(t)]


def _stages(groups: list[InputGroup]) -> list[list[InputGroup]]:
    """Groups in forward order, cut where one group's input depends on the one before: a group
    fed by a norm starts a stage and ends it; groups fed from inside a block (o_proj, the
    experts' down_proj) stay together until the next norm."""
    stages: list[list[InputGroup]] = []
    for g in groups:
        if g.norm is not None or not stages or stages[-1][-1].norm is not None:
            stages.append([g])
        else:
            stages[-1].append(g)
    return stages


def _quantize_group(layer: nn.Module, adapter: Adapter, group: InputGroup, stats: dict[str, InputStats],
                    scheme: Scheme, permute_only: bool, splits: dict[str, list[int]]) -> torch.Tensor | None:
    mods = [get_path(layer, p) for p in group.linears]
    members = [stats[p] for p in group.linears]
    n_in = mods[0].in_features
    if not permute_only and scheme.gptq.enabled and scheme.gptq.float_target:
        with torch.no_grad():
            for m, st in zip(mods, members):
                m.weight.copy_(float_target_weight(m.weight.float(), st.xtx, st.cross, scheme.gptq.damp).to(m.weight.dtype))
    xtx = [s.xtx.clone() for s in members]
    if group.norm is None and len(mods) == 1 and group.linears[0] in splits:
        return quantize_row_sharded(layer, group.linears[0], mods[0], xtx[0], splits[group.linears[0]], scheme, permute_only)
    sqsum = torch.stack([torch.diag(h) for h in xtx]).sum(0)
    if not permute_only and scheme.smooth.enabled and group.norm is not None:
        amax = torch.stack([s.amax for s in members]).amax(0)
        s = smooth_scales(amax, [m.weight for m in mods], scheme.smooth.alpha)
        fold_into_norm(get_path(layer, group.norm).weight, s, adapter.norm_offset)
        with torch.no_grad():
            for m in mods:
                m.weight.mul_(s[None, :].to(m.weight.dtype))
            for p in group.extra:
                get_path(layer, p).mul_(s[None, :])
        xtx = [h / s[:, None] / s[None, :] for h in xtx]
        sqsum = sqsum / s.pow(2)
    k = scheme.outliers.k_for(n_in)
    perm = outlier_permutation(sqsum, k) if k else None
    input_perm = None
    if perm is not None:
        if group.norm is not None:
            set_path(layer, group.norm, PermutedNorm(get_path(layer, group.norm), perm))
            with torch.no_grad():
                for p in group.extra:
                    w = get_path(layer, p)
                    w.copy_(w[:, perm])
        else:
            input_perm = perm
        xtx = [h[perm][:, perm] for h in xtx]
    weights = [m.weight.detach().float() if perm is None else m.weight.detach().float()[:, perm] for m in mods]
    quantized = quantize_weights(weights, xtx, scheme, k, shared_input=group.norm is not None and not adapter.is_moe) \
        if scheme.weights.enabled and not permute_only else [None] * len(mods)
    for path, m, w, qw in zip(group.linears, mods, weights, quantized):
        if permute_only or not scheme.weights.enabled:
            if not permute_only and not scheme.activations.enabled:
                continue
            act = None if permute_only else scheme.activations
            new = QuantLinear.from_float(w, act, input_perm, m.bias, k, scheme.outliers.precision)
        else:
            new = QuantLinear.from_quantized(qw, scheme.activations, input_perm, m.bias, scheme.outliers.precision)
        set_path(layer, path, new)
    return perm
