"""Read lowbit-quantized checkpoints: ``model.safetensors`` (packed codes, scales, permutations,
float embeddings/norms; its header carries the lowbit marker and the config's hash),
``config.json`` (the base model's config), ``lowbit_config.json`` (format version, scheme, module
layout, the files written, size and SHA-256 of the tensors file) and the tokenizer. Every load
checks both hashes, so damaged or hand-edited files never load silently (see ``integrity``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from lowbit.errors import CheckpointError
from lowbit.formats.scheme import Scheme, SchemeError

from lowbit.io.integrity import CONFIG_HASH_KEY, MARKER, TRUST_ENV, config_digest, has_marker, sha256_file, tensors_metadata, trusting
from lowbit.checkpoint.layout import check_layout, rebuild
from lowbit.io.swap import is_temp_name

FORMAT_VERSION = 2
UNHASHED_VERSIONS = (1,)  # written before the config hash existed: loadable only when trusted
CONFIG_NAME = "lowbit_config.json"
WEIGHTS_NAME = "model.safetensors"
TRUST_HINT = f"set {TRUST_ENV}=1 (or pass trust_edits=True) to load it unverified"


def is_quantized_dir(path: str | os.PathLike) -> bool:
    """A lowbit checkpoint, complete or not: its config, or a tensors file with the lowbit marker."""
    p = Path(path)
    return (p / CONFIG_NAME).is_file() or has_marker(p / WEIGHTS_NAME)


def read_meta(path: str | os.PathLike) -> dict:
    """``lowbit_config.json`` of a checkpoint of a format this lowbit reads."""
    path = Path(path)
    p = path / CONFIG_NAME
    if is_temp_name(path.name):
        raise CheckpointError(f"{path} is the temporary folder of an unfinished lowbit save, not a checkpoint")
    if not p.is_file():
        if has_marker(path / WEIGHTS_NAME):
            raise CheckpointError(f"{path} is an incomplete lowbit checkpoint: {CONFIG_NAME} is missing "
                                  "(a save was interrupted?); quantize again")
        raise CheckpointError(f"{path} is not a lowbit checkpoint: {CONFIG_NAME} is missing")
    try:
        meta = json.loads(p.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{p} is corrupt (not valid JSON: {e})") from e
    version = meta.get("format_version") if isinstance(meta, dict) else None
    if version != FORMAT_VERSION and version not in UNHASHED_VERSIONS:
        raise CheckpointError(f"{p}: unknown format_version {version!r}; this lowbit reads version {FORMAT_VERSION}")
    return meta


def checked_weights_file(path: str | os.PathLike, meta: dict, sha256: bool = True, trust_edits: bool | None = None) -> Path:
    """The tensors file of a checkpoint, after checking that it is lowbit's, that the config and
    the tensors are those recorded with each other (the tensors' full SHA-256 only if ``sha256``);
    a clear :class:`CheckpointError` otherwise. ``trust_edits`` skips the recorded sizes and hashes."""
    trust = trusting(trust_edits)
    want = meta.get("weights") if isinstance(meta.get("weights"), dict) else {}
    wpath = Path(path) / want.get("file", WEIGHTS_NAME)
    if not wpath.is_file():
        raise CheckpointError(f"{wpath} is missing")
    header = tensors_metadata(wpath)
    if header is None:
        raise CheckpointError(f"{wpath} is truncated or corrupt: not a readable safetensors file")
    if header.get("format") != MARKER:
        raise CheckpointError(f"{wpath} was not written by lowbit (no 'format: lowbit' in its header)")
    if trust:
        return wpath
    if meta.get("format_version") in UNHASHED_VERSIONS:
        raise CheckpointError(f"{path}: format {meta['format_version']} records no hash of {CONFIG_NAME}, so edits "
                              f"cannot be detected; quantize again, or {TRUST_HINT}")
    size = wpath.stat().st_size
    if "bytes" in want and size != want["bytes"]:
        raise CheckpointError(f"{wpath} is truncated or corrupt: {size} bytes, expected {want['bytes']}")
    if "sha256" not in want or CONFIG_HASH_KEY not in header:
        raise CheckpointError(f"{path}: the recorded hash of {'the tensors' if 'sha256' not in want else CONFIG_NAME} "
                              f"is missing (hand-edited?); {TRUST_HINT}")
    if header[CONFIG_HASH_KEY] != config_digest(meta):
        raise CheckpointError(f"{path / CONFIG_NAME} was edited after saving (its hash does not match the one in "
                              f"{wpath.name}); {TRUST_HINT}")
    if sha256 and sha256_file(wpath) != want["sha256"]:
        raise CheckpointError(f"{wpath} is corrupt: its SHA-256 does not match {CONFIG_NAME}; {TRUST_HINT}")
    return wpath


def open_checkpoint(path: str | os.PathLike, sha256: bool = True, trust_edits: bool | None = None) -> tuple[dict, Scheme, Path]:
    """``(meta, scheme, tensors file)`` of a verified checkpoint whose layout fits its scheme."""
    meta = read_meta(path)
    try:
        scheme = Scheme.from_dict(meta["scheme"])
    except (KeyError, SchemeError, TypeError) as e:
        raise CheckpointError(f"{Path(path) / CONFIG_NAME}: bad scheme: {e}") from e
    wpath = checked_weights_file(path, meta, sha256, trust_edits)
    try:
        check_layout(meta.get("layout", {}), scheme)
    except (ValueError, TypeError, AttributeError) as e:
        raise CheckpointError(f"{Path(path) / CONFIG_NAME}: {e}") from e
    return meta, scheme, wpath


def load_quantized(path: str | os.PathLike, device: str = "cpu", trust_edits: bool | None = None):
    """``(model, tokenizer)`` rebuilt from a checkpoint directory (no float weights needed);
    the tokenizer is None when the checkpoint has none."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from lowbit.nn.kv_cache import install_kv_quantization

    path = Path(path)
    meta, scheme, wpath = open_checkpoint(path, trust_edits=trust_edits)
    try:
        state = load_file(str(wpath))
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"{wpath} is truncated or corrupt: {e}") from e
    config = AutoConfig.from_pretrained(path)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    try:
        rebuild(model, meta.get("layout", {}))
    except (AttributeError, IndexError, KeyError, TypeError) as e:
        raise CheckpointError(f"{path / CONFIG_NAME}: the layout does not fit the model in config.json: {e!r}") from e
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as e:  # a tensor of another shape than its layout says
        raise CheckpointError(f"{wpath} does not fit its layout: {' '.join(str(e).split())[:300]}") from e
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
