"""Read a compressed-tensors checkpoint (as llm-compressor writes it) onto lowbit's packed
modules: INT weights in ``pack-quantized`` (int32 words) or ``int-quantized`` / ``naive-quantized``
(int8 values), per group (GPTQ act order with ``weight_g_idx`` too) or per channel, symmetric or
with a zero point, weight-only or with dynamic per-token / per-group INT activations. Each targeted ``nn.Linear`` becomes a
:class:`QuantLinear` holding the same codes; anything else in the config is refused by name.

A config that contradicts its tensors is refused, never read as another model: each quantized
layer's tensors must have exactly the dtypes and shapes its bits, group, symmetry, weight_shape and
bias give, with nothing left over; only the files the model names (its index, else
``model.safetensors``) are read.

Scales are stored FP16 in lowbit; bf16 and fp16 scales convert exactly, wider ones are rounded
(with a warning that gives the largest relative change).
"""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import torch
from torch import nn

from lowbit.formats.int32_words import unpack_int32
from lowbit.formats.grid import Grid
from lowbit.formats.scheme import ActArgs, Scheme, SchemeError, WeightArgs, is_int
from lowbit.formats.quantized_weight import QuantizedWeight

from lowbit.errors import CheckpointError

FORMATS = ("pack-quantized", "int-quantized", "naive-quantized")


def ct_quantization_config(path: str | Path) -> dict | None:
    """The compressed-tensors ``quantization_config`` of a model folder, or None."""
    p = Path(path) / "config.json"
    if not p.is_file():
        return None
    try:
        q = json.loads(p.read_text()).get("quantization_config")
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        return None
    return q if isinstance(q, dict) and q.get("quant_method") == "compressed-tensors" else None


def _matches(name: str, module: nn.Module, target: str) -> bool:
    if target.startswith("re:"):
        return re.match(target[3:], name) is not None
    return target == name or target == type(module).__name__


def _scheme_for(name: str, module: nn.Module, groups: dict, ignore: list[str]) -> dict | None:
    """compressed-tensors' precedence: exact name, then regex, then class name."""
    if any(_matches(name, module, t) for t in ignore):
        return None
    for kind in ("name", "re", "class"):
        for g in groups.values():
            for t in g.get("targets", []):
                is_re = t.startswith("re:")
                ok = (kind == "re" and is_re and _matches(name, module, t)) or \
                     (kind == "name" and not is_re and t == name) or \
                     (kind == "class" and not is_re and t == type(module).__name__)
                if ok:
                    return g
    return None


def _check_scheme(name: str, g: dict, fmt: str) -> None:
    w, a = g.get("weights"), g.get("input_activations")
    bad = []
    if fmt not in FORMATS:
        bad.append(f"format {fmt!r} (lowbit reads {', '.join(FORMATS)})")
    if not w or w.get("type") != "int" or w.get("num_bits") not in (2, 3, 4, 5, 6, 8):
        bad.append(f"weights {w!r} (lowbit reads INT weights of 2-6 or 8 bits)")
    elif w.get("strategy") not in ("group", "channel"):
        bad.append(f"weights.strategy={w.get('strategy')!r} (lowbit reads group and channel)")
    elif w["strategy"] == "group" and not (is_int(w.get("group_size")) and w["group_size"] > 0):
        bad.append(f"weights.group_size={w.get('group_size')!r} (strategy group needs a positive integer)")
    if w and not isinstance(w.get("symmetric", True), bool):
        bad.append(f"weights.symmetric={w.get('symmetric')!r} (true or false)")
    if a is not None:
        if a.get("type") != "int" or not a.get("dynamic") or a.get("strategy") not in ("token", "group") \
                or not is_int(a.get("num_bits")) or not isinstance(a.get("symmetric", True), bool):
            bad.append(f"input_activations {a!r} (lowbit runs dynamic per-token or per-group INT activations)")
    if g.get("output_activations") is not None:
        bad.append("output_activations")
    if bad:
        raise CheckpointError(f"{name}: compressed-tensors scheme not supported by lowbit: " + "; ".join(bad))


def _fp16_scale(name: str, s: torch.Tensor) -> torch.Tensor:
    h = s.to(torch.float16)
    if not torch.equal(h.to(s.dtype), s):
        rel = ((h.float() - s.float()).abs() / s.float().abs().clamp(min=1e-30)).max().item()
        warnings.warn(f"{name}: {s.dtype} weight scales rounded to FP16 (lowbit's scale type); "
                      f"largest relative change {rel:.2e}", stacklevel=3)
    return h.float()


def _group_order(name: str, g_idx: torch.Tensor | None, n: int, group: int) -> torch.Tensor | None:
    """The input permutation that makes ``weight_g_idx``'s groups (GPTQ act order "group")
    contiguous, which lowbit's QuantLinear applies to its input; None for storage order."""
    if g_idx is None or not group:
        return None
    g_idx = g_idx.long().reshape(-1)
    if g_idx.numel() != n:
        _bad(name, f"weight_g_idx has {g_idx.numel()} entries for {n} columns")
    if torch.equal(g_idx, torch.arange(n) // group):
        return None
    perm = torch.argsort(g_idx, stable=True)
    if not torch.equal(g_idx[perm], torch.arange(n) // group):
        _bad(name, f"weight_g_idx does not give every group {group} columns")
    return perm


def _bad(name: str, what: str):
    raise CheckpointError(f"{name}: {what}")


FLOATS = (torch.float16, torch.bfloat16, torch.float32)


def _check_layer_tensors(name: str, t: dict[str, torch.Tensor], w: dict, fmt: str, shape: tuple[int, int],
                         has_bias: bool) -> None:
    """Every tensor stored under a quantized layer, in the exact dtype and shape that its config
    (bits, group, symmetry) and its module (``shape``, bias) give it: a config that contradicts its
    tensors would otherwise be read as another model, and a tensor left over would be dropped."""
    out, n = shape
    bits, sym, group = w["num_bits"], w.get("symmetric", True), w["group_size"] if w["strategy"] == "group" else 0
    if group and n % group:
        _bad(name, f"groups of {group} do not cover its {n} input columns")
    ng, per = (n // group if group else 1), 32 // bits
    if fmt == "pack-quantized":
        main, zp = ("weight_packed", (torch.int32,), (out, -(-n // per))), ((torch.int32,), (-(-out // per), ng))
    else:
        main, zp = ("weight", (torch.int8,), (out, n)), ((torch.int8,), (out, ng))
    want = {main[0]: main[1:], "weight_scale": (FLOATS, (out, ng)), "weight_zero_point": zp,
            "weight_g_idx": ((torch.int32, torch.int64), (n,)), "weight_shape": ((torch.int32, torch.int64), (2,))}
    if has_bias:
        want["bias"] = (FLOATS, (out,))
    where = f"{fmt} {'symmetric' if sym else 'asymmetric'} INT{bits}, {f'groups of {group}' if group else 'per channel'}"
    extra = sorted(set(t) - set(want))
    if extra:
        _bad(name, f"tensor(s) {extra} are not part of a {where} layer{'' if has_bias else ' without a bias'}")
    needed = {main[0], "weight_scale"} | ({"bias"} if has_bias else set()) | (set() if sym else {"weight_zero_point"})
    missing = sorted(needed - set(t))
    if missing:
        _bad(name, f"tensor(s) {missing} missing ({where})")
    for k, v in t.items():
        dtypes, shp = want[k]
        if v.dtype not in dtypes or tuple(v.shape) != shp:
            _bad(name, f"{k} is {v.dtype} {list(v.shape)}, a {out}x{n} {where} layer stores "
                       f"{' or '.join(map(str, dtypes))} {list(shp)}")
    if "weight_shape" in t and t["weight_shape"].tolist() != [out, n]:
        _bad(name, f"weight_shape is {t['weight_shape'].tolist()}, the model's layer is [{out}, {n}]")
    offset = 2 ** (bits - 1)
    for k in ("weight", "weight_zero_point") if fmt != "pack-quantized" else ():
        if k in t and t[k].numel() and not (-offset <= int(t[k].min()) and int(t[k].max()) < offset):
            _bad(name, f"{k} holds values outside INT{bits}'s [{-offset}, {offset - 1}]")


def _zero_points(z: torch.Tensor, bits: int, fmt: str, out: int) -> torch.Tensor:
    """lowbit's unsigned zero points (signed zero is ``2**(bits-1)``), ``[out, groups]``."""
    if fmt == "pack-quantized":
        return unpack_int32(z, bits, out, dim=0).to(torch.int32)
    return z.to(torch.int32) + 2 ** (bits - 1)


def _quantized_weight(name: str, t: dict[str, torch.Tensor], w: dict, fmt: str,
                      shape: tuple[int, int]) -> tuple[QuantizedWeight, torch.Tensor | None]:
    bits, sym = w["num_bits"], w.get("symmetric", True)
    out, n = shape
    offset = 2 ** (bits - 1)
    if fmt == "pack-quantized":
        codes = unpack_int32(t["weight_packed"], bits, n)
    else:
        codes = (t["weight"].to(torch.int16) + offset).to(torch.uint8)
    scale = _fp16_scale(name, t["weight_scale"])
    group = w["group_size"] if w["strategy"] == "group" else 0
    zero = None
    if "weight_zero_point" in t:
        zero = _zero_points(t["weight_zero_point"], bits, fmt, out)
        if sym:  # some writers store zeros for symmetric weights; anything else is another model
            if not bool((zero == offset).all()):
                _bad(name, "the config says symmetric weights, but weight_zero_point holds nonzero zero points")
            zero = None
    perm = _group_order(name, t.get("weight_g_idx"), n, group)
    if perm is not None:
        codes = codes[:, perm]  # groups contiguous; the layer permutes its input the same way
    return QuantizedWeight(codes, scale, zero, torch.zeros(out, 0, dtype=torch.int8), torch.ones(out),
                           Grid(bits, sym, "int", torch.float16), group), perm


def _act_args(a: dict | None) -> ActArgs | None:
    if a is None:
        return None
    sym = bool(a.get("symmetric", True))
    return ActArgs(bits=a["num_bits"], group_size=a.get("group_size") or 0 if a["strategy"] == "group" else 0,
                   symmetric=sym, scale_rule="compressed-tensors" if sym else "signed")


INDEX_NAME = "model.safetensors.index.json"


def _read_tensors(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of the files the model names (its index's shards, else ``model.safetensors``),
    as transformers and vLLM read them: never a stray ``*.safetensors`` beside them (a backup would
    replace tensors), and a tensor stored twice or outside the shard its index names is refused."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    index = path / INDEX_NAME
    where = None
    if index.is_file():
        try:
            where = json.loads(index.read_text())["weight_map"]
            files = sorted(set(where.values()))
            if not files or not all(isinstance(f, str) and f and "/" not in f and "\\" not in f for f in files):
                raise ValueError(f"shard names {files[:5]}")
        except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as e:
            raise CheckpointError(f"{index} is corrupt: {e}") from e
    elif (path / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        raise CheckpointError(f"{path} has neither model.safetensors nor {INDEX_NAME}")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            part = load_file(str(path / f))
        except (SafetensorError, OSError, ValueError, RuntimeError) as e:
            raise CheckpointError(f"{path / f} is missing, truncated or corrupt: {' '.join(str(e).split())[:300]}") from e
        for k in part:
            if k in state:
                raise CheckpointError(f"{path}: tensor {k} is stored twice (in {f} and another shard)")
            if where is not None and where.get(k) != f:
                raise CheckpointError(f"{path}: tensor {k} is in {f}, but {INDEX_NAME} puts it in {where.get(k)!r}")
        state.update(part)
    if where is not None and set(where) - set(state):
        raise CheckpointError(f"{path}: {INDEX_NAME} lists tensors no shard holds: {sorted(set(where) - set(state))[:5]}")
    return state


def load_compressed_tensors(path: str | Path, device: str = "cpu"):
    """``(model, tokenizer)``: a compressed-tensors folder rebuilt on lowbit's QuantLinear."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from lowbit.nn.quant_linear import QuantLinear

    path = Path(path)
    q = ct_quantization_config(path)
    if q is None:
        raise CheckpointError(f"{path} is not a compressed-tensors checkpoint")
    for key in ("kv_cache_scheme", "sparsity_config", "transform_config"):
        if q.get(key):
            raise CheckpointError(f"{path}: quantization_config.{key} is not supported by lowbit")
    if q.get("quantization_status") not in (None, "compressed", "frozen"):
        raise CheckpointError(f"{path}: quantization_status {q.get('quantization_status')!r}; lowbit reads compressed checkpoints")
    config = AutoConfig.from_pretrained(path)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    state = _read_tensors(path)
    groups, ignore = q.get("config_groups", {}), q.get("ignore", [])
    picked: dict[str, dict] = {}
    for name, m in model.named_modules():
        if isinstance(m, nn.Linear):
            g = _scheme_for(name, m, groups, ignore)
            if g is not None:
                picked[name] = g
    decoder_scheme = None
    for name, g in picked.items():
        fmt = g.get("format") or q.get("format")
        _check_scheme(name, g, fmt)
        lin = model.get_submodule(name)
        local = {k[len(name) + 1:]: v for k, v in state.items() if k.startswith(name + ".")}
        for k in list(local):
            state.pop(f"{name}.{k}")
        shape = (lin.out_features, lin.in_features)
        _check_layer_tensors(name, local, g["weights"], fmt, shape, lin.bias is not None)
        qw, perm = _quantized_weight(name, local, g["weights"], fmt, shape)
        bias = local.get("bias")
        try:
            act = _act_args(g.get("input_activations"))
        except SchemeError as e:
            raise CheckpointError(f"{name}: compressed-tensors input_activations not supported by lowbit: {e}") from e
        new = QuantLinear.from_quantized(qw, act, perm, bias.float() if bias is not None else None, "int8")
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, new)
        if name != "lm_head" and decoder_scheme is None:
            decoder_scheme = g
    if "lm_head" in picked and getattr(config, "tie_word_embeddings", False):
        raise CheckpointError(f"{path}: a quantized lm_head with tie_word_embeddings is not supported")
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as e:  # a float tensor of another shape than the model's
        raise CheckpointError(f"{path}: tensors do not fit the model: {' '.join(str(e).split())[:300]}") from e
    missing = [k for k in missing if not any(k.startswith(n + ".") for n in picked)
               and not (k == "lm_head.weight" and getattr(config, "tie_word_embeddings", False))]
    if missing or unexpected:
        raise CheckpointError(f"{path}: tensors do not fit the model: missing {missing[:5]}, unexpected {unexpected[:5]}")
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
    model.to(device).eval()
    model.lowbit_scheme = _lowbit_scheme(decoder_scheme, picked.get("lm_head"), q.get("format"))
    tok = AutoTokenizer.from_pretrained(path) if (path / "tokenizer_config.json").is_file() else None
    return model, tok


def _lowbit_scheme(g: dict | None, head: dict | None, fmt: str | None) -> Scheme:
    """The lowbit scheme these modules amount to (recorded, so `save_quantized` works)."""
    def wargs(d: dict | None) -> WeightArgs:
        if d is None:
            return WeightArgs()
        w = d["weights"]
        return WeightArgs(bits=w["num_bits"], group_size=(w.get("group_size") or 0) if w["strategy"] == "group" else 0,
                          symmetric=w.get("symmetric", True))
    act = _act_args(g.get("input_activations")) if g else None
    return Scheme(name=f"compressed-tensors:{fmt}", weights=wargs(g), activations=act or ActArgs(),
                  lm_head=wargs(head))
