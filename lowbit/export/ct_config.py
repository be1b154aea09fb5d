"""lowbit's packed-linear layouts as compressed-tensors 0.17 quantization schemes, as plain data.

Each function maps one piece of a lowbit checkpoint (a :class:`QuantLinearLayout`, the KV-cache
args) onto the JSON that ``config.json``'s ``quantization_config`` holds, or says in
:class:`ExportError` why it cannot: compressed-tensors (and vLLM behind it) knows one scale per
group of whole columns, INT codes with an integer zero point, dynamic per-token or per-group
activations without clipping, and no INT4 KV cache. Nothing here touches tensors.
"""

from __future__ import annotations

from .errors import ExportError

CT_VERSION = "0.17.0"
PACKED = "pack-quantized"  # weight-only INT: codes packed into int32, zero points packed along rows
INT = "int-quantized"  # INT weights stored as int8 values, with quantized input activations


def _int_args(bits: int, symmetric: bool, group: int, *, dynamic: bool, token: bool = False,
              actorder: str | None = None) -> dict:
    if token:
        strategy, group_size = "token", None
    elif group:
        strategy, group_size = "group", group
    else:
        strategy, group_size = "channel", None
    return {"num_bits": bits, "type": "int", "symmetric": symmetric, "group_size": group_size,
            "strategy": strategy, "block_structure": None, "dynamic": dynamic, "actorder": actorder,
            "scale_dtype": None, "zp_dtype": None if symmetric else "torch.int8",
            "observer": None if dynamic else "memoryless_minmax", "observer_kwargs": {}}


def weight_problems(name: str, layout) -> list[str]:
    """What keeps one packed linear's weights out of compressed-tensors (empty: it exports)."""
    out = []
    if layout.n_outliers:
        out.append(f"{name}: {layout.n_outliers} outlier input channels kept in {layout.outlier_precision} "
                   "(outliers.count); compressed-tensors has one grid per weight: re-quantize with "
                   "--set outliers.count=0")
    if layout.has_input_perm:
        out.append(f"{name}: its input channels are permuted inside the layer (an outlier reorder); "
                   "re-quantize with --set outliers.count=0")
    if getattr(layout, "input_transform", None):
        out.append(f"{name}: an online {layout.input_transform['kind']} transform of its input "
                   "(rotation.r4); compressed-tensors has no online rotation: re-quantize with --set rotation.r4=false")
    if layout.w_bits == 16:
        out.append(f"{name}: float weights with quantized activations; compressed-tensors' int-quantized "
                   "format needs INT weights (use weights.bits=8)")
    elif layout.w_format != "int":
        out.append(f"{name}: weights.format={layout.w_format!r} (E2M1 with FP16 scales per {layout.w_group}); "
                   "compressed-tensors holds FP4 only as NVFP4 (E4M3 scales per 16 and a global scale) or "
                   "MXFP4 (E8M0 scales per 32), which lowbit does not quantize to: use an INT scheme")
    return out


def group_problem(name: str, layout) -> str | None:
    """A group that is not a whole number of the layer's columns (lowbit pads a ragged last group;
    compressed-tensors and vLLM need ``in_features % group_size == 0``)."""
    g, n = layout.w_group, layout.in_features
    if layout.w_bits < 16 and g and n % g:
        return f"{name}: weights.group_size={g} does not divide its {n} input columns"
    act = layout.act
    if act is not None and act["group_size"] and n % act["group_size"]:
        return f"{name}: activations.group_size={act['group_size']} does not divide its {n} input columns"
    return None


def group_hint(widths: set[int]) -> str:
    ok = [g for g in (128, 64, 32, 16) if all(w % g == 0 for w in widths)]
    if ok:
        return f"re-quantize with --set weights.group_size={ok[0]} (divides every width) or 0 (one scale per output row)"
    return "re-quantize with --set weights.group_size=0 (one scale per output row)"


def activation_args(name: str, act: dict | None) -> tuple[dict | None, list[str]]:
    """``input_activations`` for lowbit's dynamic per-token activations (None: weight-only)."""
    if act is None:
        return None, []
    problems = []
    if act["format"] != "int":
        problems.append(f"{name}: activations.format={act['format']!r}; only INT activations map onto "
                        "compressed-tensors' dynamic token/group quantization")
    if act["clip_ratio"] != 1.0:
        problems.append(f"{name}: activations.clip_ratio={act['clip_ratio']} (compressed-tensors has no clipping "
                        "field for dynamic activations); re-quantize with --set activations.clip_ratio=1.0")
    args = _int_args(act["bits"], act["symmetric"], act["group_size"], dynamic=True, token=not act["group_size"])
    return args, problems


def module_scheme(name: str, layout, act_order: bool) -> tuple[str, dict, list[str]]:
    """(format, scheme without targets, problems) of one packed linear; whole groups are checked
    apart (:func:`group_problem`), so that one hint can cover every layer."""
    problems = weight_problems(name, layout)
    inputs, p = activation_args(name, layout.act)
    problems += p
    # lowbit's act order fits static groups in storage order: no g_idx ("weight" = "static" in 0.17)
    w = _int_args(layout.w_bits, layout.w_symmetric, layout.w_group, dynamic=False,
                  actorder="static" if act_order and layout.w_group else None)
    fmt = PACKED if inputs is None else INT
    return fmt, {"weights": w, "input_activations": inputs, "output_activations": None, "format": fmt}, problems


def kv_cache_problem(kv: dict) -> str | None:
    if kv["bits"] >= 16:
        return None
    return (f"kv_cache.bits={kv['bits']} (dynamic per token and head, "
            f"{'symmetric' if kv['symmetric'] else 'asymmetric'}): compressed-tensors' kv_cache_scheme holds "
            "static per-tensor/per-head scales (vLLM: FP8 only); pass --kv-cache float to export the weights "
            "with a float KV cache, or re-quantize without the KV cache scheme")


def quantization_config(groups: list[tuple[list[str], dict]], ignore: list[str]) -> dict:
    """The ``quantization_config`` of config.json; ``groups``: (targets, scheme) in priority order."""
    formats = {s["format"] for _, s in groups}
    return {
        "quant_method": "compressed-tensors",
        "version": CT_VERSION,
        "format": formats.pop() if len(formats) == 1 else "mixed-precision",
        "quantization_status": "compressed",
        "config_groups": {f"group_{i}": {"targets": t, **s} for i, (t, s) in enumerate(groups)},
        "ignore": ignore,
        "kv_cache_scheme": None,
        "global_compression_ratio": None,
        "sparsity_config": {},
        "transform_config": {},
    }
