"""``quantize_model(model, scheme, calib_ids)``: one call applies a scheme, layer by layer.

For every decoder layer: collect input statistics of its linears (float layer, inputs coming
from the already-quantized layers before it), then for each group of linears reading one input,
in named steps: float target (``float_target.aim_at_float_outputs``), TP row shards
(``row_shards``), smoothing (``smooth.smooth_group``), the outlier permutation
(``outliers.permute_group_input``), GPTQ/RTN into packed QuantLinears
(``replace_linears.replace_group_linears``); then run the *quantized* layer to make the next
layer's inputs. Which steps run is decided once, in ``recipe_steps.RecipeSteps``.

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

from lowbit.formats.scheme import Scheme
from lowbit.models.adapters import Adapter, InputGroup, get_adapter
from lowbit.models.module_paths import get_path
from lowbit.nn.kv_cache import PackedKVCache, install_scheme_kv_cache

from .calibrate import InputStats, capture_layer_inputs, capture_linear_inputs, collect_stats, run_layer
from .float_target import aim_at_float_outputs
from .head import head_hessian, quantize_head
from .outliers import outlier_permutation, permute_group_input
from .recipe_steps import RecipeSteps
from .replace_linears import replace_group_linears
from .row_shards import quantize_row_sharded, tp_splits
from .smooth import smooth_group


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
    adapter = get_adapter(model)
    from .rotation import rotate_model; rotate_model(model, scheme.rotation)  # noqa: E702 (float pre-pass, nothing if kind none)
    if load_layer is not None and adapter.is_moe:
        raise ValueError("quantizing from disk supports dense models; load a mixture-of-experts model whole")
    steps = RecipeSteps.of(scheme, permute_only)
    _check_ids(calib_ids, steps.needs_linear_stats)
    t0 = time.perf_counter()
    splits = tp_splits(model, scheme)
    adapter.prepare(model)
    report = QuantizeReport(scheme, 0 if calib_ids is None else calib_ids.shape[0],
                            0 if calib_ids is None else calib_ids.shape[1], 0.0, 0)
    layers = adapter.layers(model)
    if steps.needs_linear_stats:
        orig_device = next(model.parameters()).device
        _to_device(model, device)
        last = _quantize_layers(model, adapter, layers, scheme, steps, splits, calib_ids, device, batch_size,
                                progress, load_layer, report)
        if steps.lm_head:  # on the calibration device, with what the head reads
            _quantize_head(model, scheme, get_path(model, adapter.arch.final_norm), last)
        del last
        model.to(orig_device)
        report.layers = len(layers)
    elif load_layer is not None:  # nothing to calibrate (a KV-cache-only scheme): just load the layers
        for i, layer in enumerate(layers):
            load_layer(i, layer, "cpu")
    if steps.lm_head and not steps.needs_linear_stats:  # no calibration outputs: RTN
        quantize_head(model, scheme.lm_head)
    if steps.kv_cache:
        install_scheme_kv_cache(model, scheme.kv_cache)
    model.lowbit_scheme = scheme
    report.seconds = time.perf_counter() - t0
    return report


def _quantize_head(model: nn.Module, scheme: Scheme, norm: nn.Module, last: list[torch.Tensor]) -> None:
    """The LM head by GPTQ on ``norm(last)`` where the scheme runs GPTQ, by RTN otherwise (also
    with fewer calibration tokens than the head has inputs: GPTQ's damping keeps it ahead there,
    README)."""
    if not scheme.gptq.enabled:
        quantize_head(model, scheme.lm_head)
        return
    quantize_head(model, scheme.lm_head, head_hessian(norm, last), scheme.gptq)


def _quantize_layers(model: nn.Module, adapter: Adapter, layers: nn.ModuleList, scheme: Scheme, steps: RecipeSteps,
                     splits: dict[str, list[int]], calib_ids: torch.Tensor, device: str, batch_size: int,
                     progress: bool, load_layer, report: QuantizeReport) -> list[torch.Tensor]:
    """Layer by layer: statistics (per stage when true-sequential), each group quantized, then the
    quantized layer run to make the next layer's inputs (and the float copy, for float targets).
    Returns the last quantized layer's outputs (what the final norm and the LM head read)."""
    inputs, kwargs = capture_layer_inputs(model, layers, calib_ids, device, batch_size)
    make_cache = None
    if steps.kv_cache:
        make_cache = lambda: PackedKVCache.for_scheme(model.config, scheme.kv_cache)  # noqa: E731
    if steps.float_target and adapter.is_moe:
        raise ValueError("gptq.float_target needs the same tokens in the float and quantized model; "
                         "a mixture of experts routes them differently (use it on dense models)")
    finputs = inputs if steps.float_target else None
    for i, layer in enumerate(tqdm(layers, desc=f"quantize {scheme.name}", disable=not progress)):
        if load_layer is not None:
            load_layer(i, layer, device)
        flayer = copy.deepcopy(layer) if steps.float_target else None
        groups = adapter.groups(layer)
        sequential = steps.true_sequential
        for stage in (_stages(groups) if sequential else [groups]):
            names = [n for g in stage for n in g.linears]
            shared = [g.linears for g in stage if g.shared]
            targets = None
            if steps.float_target:
                heads = [g.linears[0] for g in stage]
                targets = capture_linear_inputs(flayer, heads, finputs, kwargs[i])
            stats = collect_stats(layer, names, inputs, kwargs[i], shared=shared, targets=targets, stop_early=sequential,
                                  make_cache=make_cache if sequential else None)
            for g in stage:
                perm = _quantize_group(layer, adapter, g, stats, scheme, steps, splits)
                if perm is not None:
                    report.permutations[f"layers.{i}.{g.linears[0]}"] = perm.tolist()
            del stats, targets
        inputs = run_layer(layer, inputs, kwargs[i], make_cache)
        if steps.float_target:
            finputs = run_layer(flayer, finputs, kwargs[i])
            del flayer
    return inputs


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
    """Groups in forward order, cut where one group's input depends on the one before (the
    adapter numbers them: attention in, attention out, MLP in, MLP out; all experts' down_proj
    are one stage)."""
    stages: list[list[InputGroup]] = []
    for g in groups:
        if not stages or stages[-1][-1].stage != g.stage:
            stages.append([g])
        else:
            stages[-1].append(g)
    return stages


def _quantize_group(layer: nn.Module, adapter: Adapter, group: InputGroup, stats: dict[str, InputStats],
                    scheme: Scheme, steps: RecipeSteps, splits: dict[str, list[int]]) -> torch.Tensor | None:
    """One input group, step by step: float target, (TP row shards), smoothing, outlier
    permutation, GPTQ/RTN into QuantLinears. Returns the group's permutation (None: none)."""
    mods = [get_path(layer, p) for p in group.linears]
    members = [stats[p] for p in group.linears]
    if steps.float_target:
        aim_at_float_outputs(mods, members, scheme.gptq.damp)
    xtx = [s.xtx.clone() for s in members]
    if group.norm is None and len(mods) == 1 and group.linears[0] in splits:
        return quantize_row_sharded(layer, group.linears[0], mods[0], xtx[0], splits[group.linears[0]], scheme, steps)
    sqsum = torch.stack([torch.diag(h) for h in xtx]).sum(0)
    if steps.smooth and group.norm is not None:
        xtx, sqsum = smooth_group(layer, group, mods, [s.amax for s in members], xtx, sqsum, scheme.smooth.alpha,
                                  adapter.norm_offset)
    k = scheme.outliers.k_for(mods[0].in_features)
    perm = outlier_permutation(sqsum, k) if k else None
    input_perm = None
    if perm is not None:
        input_perm = permute_group_input(layer, group, perm)
        xtx = [h[perm][:, perm] for h in xtx]
    weights = [m.weight.detach().float() if perm is None else m.weight.detach().float()[:, perm] for m in mods]
    replace_group_linears(layer, group.linears, mods, weights, xtx, scheme, steps, k, input_perm,
                          shared_input=group.shared)
    return perm
