"""Write a lowbit checkpoint: into a temporary folder beside the target, then swapped in whole
(``swap.publish_dir``), so the target is always a complete checkpoint, old or new. A folder is
overwritten only if it is empty or a lowbit checkpoint holding nothing but the files lowbit
wrote; a save never deletes a file it did not write."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from torch import nn

from lowbit.errors import UsageError
from lowbit.formats.scheme import Scheme

from lowbit.checkpoint.opener import CONFIG_NAME, FILES_HASH_KEY, FORMAT_VERSION, WEIGHTS_NAME, is_quantized_dir
from lowbit.io.atomic import fsync_tree
from lowbit.io.integrity import CONFIG_HASH_KEY, MARKER, config_digest, sha256_file
from lowbit.checkpoint.layout import describe
from lowbit.io.outputs import OutputPathError, check_output_dir
from lowbit.io.swap import publish_dir, recover_stale_temp_dirs, temp_prefix

# What a save before format 2 (which lists its files) may have written, besides the two above.
LEGACY_FILES = {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                "special_tokens_map.json", "vocab.json", "merges.txt", "added_tokens.json", "chat_template.jinja",
                "tokenizer.model"}


def _written_files(folder: Path) -> set[str]:
    """The names a lowbit save put in ``folder`` (its own list; the usual names for older saves)."""
    try:
        files = json.loads((folder / CONFIG_NAME).read_text()).get("files")
    except (OSError, ValueError, AttributeError):
        files = None
    return {CONFIG_NAME, WEIGHTS_NAME} | (set(files) if isinstance(files, list) else LEGACY_FILES)


def check_save_target(out: str | os.PathLike, flag: str = "--out") -> None:
    """Raise :class:`OutputPathError` unless a checkpoint can be saved at ``out`` without losing
    anything: absent, an empty folder, or a lowbit checkpoint with only lowbit's files; never the
    working directory or a folder above it; its parent writable."""
    out = Path(out).absolute()
    check_output_dir(out, flag)
    if not out.exists():
        return
    cwd = Path.cwd().resolve()
    if out.resolve() == cwd or out.resolve() in cwd.parents:
        raise OutputPathError(f"{flag} {out} is the working directory (or holds it); a checkpoint is swapped in "
                              "as a whole folder, so give a path beside it, e.g. ../NAME")
    entries = {p.name for p in out.iterdir()}
    if not entries:
        check_output_dir(out.parent, f"{flag} {out}: its parent")
        return
    if not is_quantized_dir(out):
        raise OutputPathError(f"{flag} {out} exists and is not a lowbit checkpoint; refusing to overwrite it")
    foreign = sorted(entries - _written_files(out))
    if foreign:
        raise OutputPathError(f"{flag} {out} also holds files lowbit did not write ({', '.join(foreign[:5])}); "
                              "move them out or save elsewhere")
    check_output_dir(out.parent, f"{flag} {out}: its parent")


def _tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    state = model.state_dict()
    tied = getattr(model.config, "tie_word_embeddings", False)
    if tied and "lm_head.weight" in state:
        state.pop("lm_head.weight")  # the embedding, shared; re-tied on load
    return {k: v.detach().contiguous().cpu() for k, v in state.items()}


def _write(model: nn.Module, scheme: Scheme, folder: Path, tokenizer, extra: dict | None) -> None:
    from safetensors.torch import save_file

    model.config.save_pretrained(folder)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    names = sorted({p.name for p in folder.iterdir()} | {WEIGHTS_NAME, CONFIG_NAME})
    # config.json and the tokenizer shape the model as much as the tensors do: their hashes go in the
    # part of the config that the tensors' header hashes, so an edit of any of them is caught on load
    side = {p.name: sha256_file(p) for p in sorted(folder.iterdir()) if p.is_file()}
    meta = json.loads(json.dumps({"format_version": FORMAT_VERSION, "scheme": scheme.to_dict(),
                                  "layout": describe(model), "files": names, FILES_HASH_KEY: side,
                                  "extra": extra or {}}, default=float))
    header = {"format": MARKER, "format_version": str(FORMAT_VERSION), CONFIG_HASH_KEY: config_digest(meta)}
    save_file(_tensors(model), str(folder / WEIGHTS_NAME), metadata=header)
    meta["weights"] = {"file": WEIGHTS_NAME, "bytes": (folder / WEIGHTS_NAME).stat().st_size,
                       "sha256": sha256_file(folder / WEIGHTS_NAME)}
    (folder / CONFIG_NAME).write_text(json.dumps(meta, indent=1))


def _refuse_kernel_linears(model: nn.Module) -> None:
    """A model on the fast kernels holds kernel-prepared tensors, not the packed ones a checkpoint
    records: saving it would lose its linears, so it is refused, naming the fix."""
    from lowbit.accelerate.fuse import FusedPart
    from lowbit.accelerate.linears import KernelLinear

    fast = [n for n, m in model.named_modules() if isinstance(m, (KernelLinear, FusedPart))]
    if fast:
        raise UsageError(f"the model runs the fast kernels ({len(fast)} linears, e.g. {fast[0]}), which hold no "
                         "packed weights to save; load it with kernel='reference' (load_model(..., kernel="
                         "'reference') or load_quantized) and save that")


def save_quantized(model: nn.Module, out_dir: str | os.PathLike, tokenizer=None, extra: dict | None = None) -> Path:
    """Write ``model`` (quantized by :func:`lowbit.quantize.quantize_model`) to ``out_dir``."""
    scheme = getattr(model, "lowbit_scheme", None)
    if not isinstance(scheme, Scheme):
        raise ValueError("the model has no lowbit scheme; quantize it with lowbit.quantize.quantize_model first")
    _refuse_kernel_linears(model)
    out = Path(out_dir).absolute()
    check_save_target(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    recover_stale_temp_dirs(out.parent)
    tmp = Path(tempfile.mkdtemp(prefix=temp_prefix(), dir=out.parent))
    try:
        _write(model, scheme, tmp, tokenizer, extra)
        fsync_tree(tmp)
        publish_dir(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return Path(out_dir)

