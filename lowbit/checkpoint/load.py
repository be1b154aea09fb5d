"""Load a whole lowbit checkpoint: the model's module tree is built on the ``meta`` device (no
memory), given the layout the checkpoint records, and each tensor is read from the file into
its place, so peak memory is the checkpoint's tensors, never a float32 model beside them."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import nn

from lowbit.errors import CheckpointError

from lowbit.checkpoint.layout import rebuild
from lowbit.checkpoint.opener import CONFIG_NAME, OpenedCheckpoint, open_folder


def skeleton(ck: OpenedCheckpoint) -> nn.Module:
    """The module tree ``ck`` was saved from, every tensor on the meta device."""
    from lowbit.models.lazy import meta_model

    model = meta_model(ck.config, torch.float32)
    try:
        with torch.device("meta"):
            rebuild(model, ck.layout)
    except (AttributeError, IndexError, KeyError, TypeError) as e:
        raise CheckpointError(f"{ck.path / CONFIG_NAME}: the layout does not fit the model in config.json: {e!r}") from e
    return model


# a model quantized in half precision saves its float parts so; they load exactly into float32
WIDENS = (torch.float16, torch.bfloat16)


def _fill(model: nn.Module, ck: OpenedCheckpoint) -> None:
    """Read every tensor the model stores and put it in place; the file must hold exactly the
    model's tensors, each in its module's dtype (half-precision float parts widen to float32):
    a cast of codes, scales or permutations would be another model, even with ``trust_edits``,
    which waives the hashes, not the structure."""
    wanted = model.state_dict(keep_vars=True)
    stored = set(ck.tensors.names())
    tied = getattr(ck.config, "tie_word_embeddings", False)
    missing = [k for k in wanted if k not in stored and not (k == "lm_head.weight" and tied)]
    unexpected = [k for k in stored if k not in wanted]
    if missing or unexpected:
        raise CheckpointError(f"{ck.tensors.file} does not fit its layout: missing {missing[:5]}, unexpected {unexpected[:5]}")
    state = {}
    for name, t in wanted.items():
        if name in stored:
            v = ck.tensors.full(name)
            if v.dtype != t.dtype and not (t.dtype == torch.float32 and v.dtype in WIDENS):
                raise CheckpointError(f"{ck.tensors.file}: {name} is stored as {v.dtype}, its layout needs {t.dtype}")
            state[name] = v.to(t.dtype)
    try:
        model.load_state_dict(state, strict=False, assign=True)
    except RuntimeError as e:  # a tensor of another shape than its layout says
        raise CheckpointError(f"{ck.tensors.file} does not fit its layout: {' '.join(str(e).split())[:300]}") from e


def load_quantized(path: str | os.PathLike, device: str = "cpu", trust_edits: bool | None = None):
    """``(model, tokenizer)`` rebuilt from a checkpoint directory (no float weights needed), with
    the reference forward (``lowbit.checkpoint.load_model`` puts the fast kernels in); the
    tokenizer is None when the checkpoint has none."""
    from transformers import AutoTokenizer

    from lowbit.models.lazy import materialize_rest
    from lowbit.nn.kv_cache import install_scheme_kv_cache

    path = Path(path)
    ck = open_folder(path, trust_edits=trust_edits)
    model = skeleton(ck)
    _fill(model, ck)
    try:  # the tied head, rotary frequencies and other buffers the file does not hold
        materialize_rest(model, ck.config, ck.tensors, torch.float32, path)
    except ValueError as e:
        raise CheckpointError(f"{ck.tensors.file} does not fit its layout: {e}") from e
    model.to(device).eval()
    if ck.scheme.kv_cache.enabled:
        install_scheme_kv_cache(model, ck.scheme.kv_cache)
    model.lowbit_scheme = ck.scheme
    tok = AutoTokenizer.from_pretrained(path) if (path / "tokenizer_config.json").is_file() else None
    return model, tok
