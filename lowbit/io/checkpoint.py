"""Save and load lowbit-quantized checkpoints: ``model.safetensors`` (packed codes, scales,
permutations, float embeddings/norms), ``config.json`` (the base model's config),
``lowbit_config.json`` (format version, scheme, module layout, size and SHA-256 of the
tensors file) and the tokenizer. Written to a temporary folder and renamed into place."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from torch import nn

from lowbit.quantize.scheme import Scheme, SchemeError

from .layout import describe, rebuild

FORMAT_VERSION = 1
CONFIG_NAME = "lowbit_config.json"
WEIGHTS_NAME = "model.safetensors"


class CheckpointError(RuntimeError):
    """A lowbit checkpoint is missing, truncated, corrupt, or of an unknown format version."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def is_quantized_dir(path: str | os.PathLike) -> bool:
    return (Path(path) / CONFIG_NAME).is_file()


def _tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    state = model.state_dict()
    tied = getattr(model.config, "tie_word_embeddings", False)
    if tied and "lm_head.weight" in state:
        state.pop("lm_head.weight")  # the embedding, shared; re-tied on load
    return {k: v.detach().contiguous().cpu() for k, v in state.items()}


def save_quantized(model: nn.Module, out_dir: str | os.PathLike, tokenizer=None, extra: dict | None = None) -> Path:
    """Write ``model`` (quantized by :func:`lowbit.quantize.quantize_model`) to ``out_dir``."""
    from safetensors.torch import save_file

    scheme = getattr(model, "lowbit_scheme", None)
    if not isinstance(scheme, Scheme):
        raise ValueError("the model has no lowbit scheme; quantize it with lowbit.quantize.quantize_model first")
    out = Path(out_dir)
    if out.exists() and not (out.is_dir() and (is_quantized_dir(out) or not any(out.iterdir()))):
        raise FileExistsError(f"{out} exists and is not a lowbit checkpoint; refusing to overwrite it")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-lowbit-", dir=out.parent))
    try:
        save_file(_tensors(model), str(tmp / WEIGHTS_NAME), metadata={"format": "lowbit", "format_version": str(FORMAT_VERSION)})
        model.config.save_pretrained(tmp)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        meta = {
            "format_version": FORMAT_VERSION,
            "scheme": scheme.to_dict(),
            "layout": describe(model),
            "weights": {"file": WEIGHTS_NAME, "bytes": (tmp / WEIGHTS_NAME).stat().st_size,
                        "sha256": _sha256(tmp / WEIGHTS_NAME)},
            "extra": extra or {},
        }
        (tmp / CONFIG_NAME).write_text(json.dumps(meta, indent=1))
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=".old-lowbit-", dir=out.parent))
            os.replace(out, old / "x")
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def read_meta(path: str | os.PathLike) -> dict:
    p = Path(path) / CONFIG_NAME
    if not p.is_file():
        raise CheckpointError(f"{path} is not a lowbit checkpoint: {CONFIG_NAME} is missing")
    try:
        meta = json.loads(p.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{p} is corrupt (not valid JSON: {e})") from e
    version = meta.get("format_version") if isinstance(meta, dict) else None
    if version != FORMAT_VERSION:
        raise CheckpointError(f"{p}: unknown format_version {version!r}; this lowbit reads version {FORMAT_VERSION}")
    return meta


def checked_weights_file(path: str | os.PathLike, meta: dict, sha256: bool = True) -> Path:
    """The tensors file of a checkpoint, after checking it exists, has the recorded size and (if
    ``sha256``) the recorded hash; a clear :class:`CheckpointError` otherwise."""
    want = meta.get("weights", {})
    wpath = Path(path) / want.get("file", WEIGHTS_NAME)
    if not wpath.is_file():
        raise CheckpointError(f"{wpath} is missing")
    size = wpath.stat().st_size
    if "bytes" in want and size != want["bytes"]:
        raise CheckpointError(f"{wpath} is truncated or corrupt: {size} bytes, expected {want['bytes']}")
    if sha256 and "sha256" in want and _sha256(wpath) != want["sha256"]:
        raise CheckpointError(f"{wpath} is corrupt: its SHA-256 does not match {CONFIG_NAME}")
    return wpath


def load_quantized(path: str | os.PathLike, device: str = "cpu"):
    """``(model, tokenizer)`` rebuilt from a checkpoint directory (no float weights needed);
    the tokenizer is None when the checkpoint has none."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from lowbit.nn.kv_cache import install_kv_quantization

    path = Path(path)
    meta = read_meta(path)
    try:
        scheme = Scheme.from_dict(meta["scheme"])
    except (KeyError, SchemeError, TypeError) as e:
        raise CheckpointError(f"{path / CONFIG_NAME}: bad scheme: {e}") from e
    wpath = checked_weights_file(path, meta)
    try:
        state = load_file(str(wpath))
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"{wpath} is truncated or corrupt: {e}") from e
    config = AutoConfig.from_pretrained(path)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    rebuild(model, meta.get("layout", {}))
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not (k == "lm_head.weight" and getattr(config, "tie_word_embeddings", False))]
    if missing or unexpected:
        raise CheckpointError(f"{wpath} does not fit its layout: missing {missing[:5]}, unexpected {unexpected[:5]}")
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
    model.to(device).eval()
    if scheme.kv_cache.enabled:
        install_kv_quantization(model, scheme.kv_cache.bits, scheme.kv_cache.symmetric)
    model.lowbit_scheme = scheme
    tok = AutoTokenizer.from_pretrained(path) if (path / "tokenizer_config.json").is_file() else None
    return model, tok
