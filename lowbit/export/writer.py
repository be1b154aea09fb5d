"""Write a lowbit-quantized model as a compressed-tensors Hugging Face folder: config.json with
``quantization_config``, ``model.safetensors`` in that format's tensor names, the tokenizer.

Everything that does not fit is collected first and refused in one :class:`ExportError`; the
folder is written to a temporary sibling and renamed into place, so a failed export leaves
nothing behind.
"""

from __future__ import annotations

import json
from dataclasses import asdict
import os
import shutil
import tempfile
from pathlib import Path

import torch
from torch import nn

from lowbit.io.atomic import fsync_dir, fsync_tree
from lowbit.nn.experts import UnfusedExperts
from lowbit.nn.permuted_norm import PermutedNorm
from lowbit.nn.quant_linear import QuantLinear
from lowbit.nn.row_sharded import RowShardedLinear

from . import ct_config
from .errors import ExportError
from .int_quantized import int_quantized_tensors
from .pack_quantized import pack_quantized_tensors

PACKERS = {ct_config.PACKED: pack_quantized_tensors, ct_config.INT: int_quantized_tensors}
WEIGHTS_NAME = "model.safetensors"


def check_out_dir(out: str | os.PathLike) -> Path:
    """``out`` must not exist, or be an empty folder, and be writable (io.outputs); checked before any work."""
    from lowbit.io.outputs import check_output_dir

    out = Path(out)
    check_output_dir(out, "--out")
    if out.exists() and not (out.is_dir() and not any(out.iterdir())):
        raise FileExistsError(f"{out} exists and is not an empty folder; refusing to overwrite it")
    return out


def _structure_problems(model: nn.Module) -> list[str]:
    out = []
    for name, m in model.named_modules():
        if isinstance(m, PermutedNorm):
            out.append(f"{name}: the norm emits permuted channels (outlier reorder); re-quantize with --set outliers.count=0")
        elif isinstance(m, RowShardedLinear):
            out.append(f"{name}: quantized per tensor-parallel slice (--tp); re-quantize without --tp")
    if any(isinstance(m, UnfusedExperts) for m in model.modules()):
        out.append("mixture-of-experts layers: lowbit unfuses the experts into one linear pair each; mapping them "
                   "back onto transformers' fused expert tensors is not built yet")
    return out


def _summarize(problems: list[str]) -> list[str]:
    """One line per kind of problem ("layer: what"), naming its first layers: an Atom checkpoint
    has the same three problems in each of its 210 linears."""
    kinds: dict[str, list[str]] = {}
    for p in problems:
        where, sep, what = p.partition(": ")
        kinds.setdefault(what if sep else p, []).append(where if sep else "")
    out = []
    for what, names in kinds.items():
        names = [n for n in names if n]
        more = f" (and {len(names) - 3} more)" if len(names) > 3 else ""
        out.append(f"{', '.join(names[:3])}{more}: {what}" if names else what)
    return out


def plan(model: nn.Module, kv_cache: str = "refuse") -> tuple[dict, dict[str, str]]:
    """(quantization_config, {module name: format}) or an :class:`ExportError` listing every problem."""
    scheme = getattr(model, "lowbit_scheme", None)
    if scheme is None:
        raise ExportError("the model has no lowbit scheme: export a checkpoint written by `lowbit quantize`")
    problems = _structure_problems(model)
    bad_groups, widths = [], set()
    schemes: dict[str, tuple[str, dict]] = {}
    for name, m in model.named_modules():
        if not isinstance(m, QuantLinear):
            continue
        fmt, s, p = ct_config.module_scheme(name, m.layout, scheme.gptq.act_order)
        problems += p
        widths.add(m.layout.in_features)
        g = ct_config.group_problem(name, m.layout)
        if g:
            bad_groups.append(g)
        schemes[name] = (fmt, s)
    if bad_groups:
        problems += bad_groups + ["compressed-tensors needs whole groups: " + ct_config.group_hint(widths)]
    if not schemes:
        problems.append("no quantized linear layers: nothing compressed-tensors would compress")
    kv = asdict(scheme.kv_cache)
    if kv_cache == "refuse" and ct_config.kv_cache_problem(kv):
        problems.append(ct_config.kv_cache_problem(kv))
    if problems:
        raise ExportError("cannot export to compressed-tensors:\n  " + "\n  ".join(_summarize(problems)))
    # the most common scheme targets every Linear; the others (e.g. an INT8 LM head) by exact name
    counts: dict[str, int] = {}
    for _, s in schemes.values():
        key = json.dumps(s, sort_keys=True)
        counts[key] = counts.get(key, 0) + 1
    main = max(counts, key=counts.get)
    groups = [(["Linear"], json.loads(main))]
    for key in counts:
        if key != main:
            groups.append(([n for n, (_, s) in schemes.items() if json.dumps(s, sort_keys=True) == key], json.loads(key)))
    ignore = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    return ct_config.quantization_config(groups, ignore), {n: f for n, (f, _) in schemes.items()}


def _tensors(model: nn.Module, formats: dict[str, str]) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = {}
    quant = {n: m for n, m in model.named_modules() if isinstance(m, QuantLinear)}
    for name, m in quant.items():
        for k, t in PACKERS[formats[name]](m).items():
            state[f"{name}.{k}"] = t
        if m.bias is not None:
            state[f"{name}.bias"] = m.bias.detach().float().contiguous()
    prefixes = tuple(f"{n}." for n in quant)
    for k, t in model.state_dict().items():
        if not k.startswith(prefixes):
            state[k] = t.detach().contiguous().cpu()
    if getattr(model.config, "tie_word_embeddings", False) and "lm_head.weight" in state:
        state.pop("lm_head.weight")  # the embedding; transformers and vLLM re-tie it
    return state


def export_compressed_tensors(model: nn.Module, out_dir: str | os.PathLike, tokenizer=None,
                              kv_cache: str = "refuse") -> Path:
    """Write ``model`` (a lowbit-quantized model) to ``out_dir`` as compressed-tensors.

    ``kv_cache``: ``"refuse"`` (a quantized KV cache is an error) or ``"float"`` (export the
    weights; the server keeps its KV cache in float)."""
    from safetensors.torch import save_file

    if kv_cache not in ("refuse", "float"):
        raise ValueError(f"kv_cache must be 'refuse' or 'float', got {kv_cache!r}")
    out = check_out_dir(out_dir)
    qconfig, formats = plan(model, kv_cache)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-ct-", dir=out.parent))
    try:
        save_file(_tensors(model, formats), str(tmp / WEIGHTS_NAME), metadata={"format": "pt"})
        model.config.save_pretrained(tmp)
        cfg = json.loads((tmp / "config.json").read_text())
        cfg["quantization_config"] = qconfig
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        for f in tmp.iterdir():
            os.chmod(f, 0o644)  # safetensors writes 0600; an exported model is for other users and servers
        os.chmod(tmp, 0o755)
        fsync_tree(tmp)  # as a checkpoint save does: the rename must not publish unwritten data
        if out.exists():
            out.rmdir()  # empty, checked above
        os.replace(tmp, out)
        fsync_dir(out.parent)  # the rename itself, durable
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out
