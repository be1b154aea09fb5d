"""Open a lowbit checkpoint folder, the one step both loaders share (whole model:
:mod:`.load`; one tensor-parallel rank: :mod:`lowbit.parallel.shard_quantized`): ``model.safetensors`` (packed codes, scales, permutations,
float embeddings/norms; its header carries the lowbit marker and the config's hash),
``config.json`` (the base model's config), ``lowbit_config.json`` (format version, scheme, module
layout, the files written and their SHA-256, size and SHA-256 of the tensors file) and the
tokenizer. Every load checks the hashes, so damaged or hand-edited files never load silently (see ``integrity``);
the tensors are then read one by one, so no loader holds the file and the model at once."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from lowbit.errors import CheckpointError
from lowbit.formats.scheme import Scheme, SchemeError

from lowbit.io.integrity import CONFIG_HASH_KEY, MARKER, TRUST_ENV, config_digest, has_marker, sha256_file, tensors_metadata, trusting
from lowbit.checkpoint.layout import check_layout
from lowbit.io.safetensors_reader import CheckpointReader
from lowbit.io.swap import is_temp_name

FORMAT_VERSION = 2
UNHASHED_VERSIONS = (1,)  # written before the config hash existed: loadable only when trusted
CONFIG_NAME = "lowbit_config.json"
WEIGHTS_NAME = "model.safetensors"
FILES_HASH_KEY = "file_sha256"  # {name: SHA-256} of each file saved beside the tensors (config.json, tokenizer)
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
    a clear :class:`CheckpointError` otherwise, and that the files saved beside them (config.json,
    tokenizer) are unedited. ``trust_edits`` skips the recorded sizes and hashes."""
    trust = trusting(trust_edits)
    want = meta.get("weights") if isinstance(meta.get("weights"), dict) else {}
    wpath = Path(path) / _plain_name(want.get("file", WEIGHTS_NAME), path, "weights.file")
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
    _check_side_files(Path(path), meta)
    return wpath


def _plain_name(name, path, field: str) -> str:
    """A file name inside the checkpoint folder: ``weights.file`` is outside the config's hash, so
    it must not point elsewhere (another folder, an absolute path) or be no name at all."""
    if not isinstance(name, str) or name in ("", ".", "..") or "/" in name or "\\" in name or "\0" in name:
        raise CheckpointError(f"{Path(path) / CONFIG_NAME}: {field} must be a file name in the checkpoint folder, "
                              f"got {name!r}")
    return name


def _check_side_files(path: Path, meta: dict) -> None:
    """The files saved beside the tensors (config.json, tokenizer) must be those whose SHA-256 the
    (already verified) config records: an edited rope_theta or norm epsilon changes the model as
    much as an edited tensor. A checkpoint saved before these hashes existed records none."""
    recorded = meta.get(FILES_HASH_KEY)
    if recorded is None:
        return
    if not isinstance(recorded, dict):
        raise CheckpointError(f"{path / CONFIG_NAME}: {FILES_HASH_KEY} must be an object, got {type(recorded).__name__}")
    for name, digest in recorded.items():
        f = path / _plain_name(name, path, f"{FILES_HASH_KEY} entry")
        if not f.is_file():
            raise CheckpointError(f"{f} is missing (the checkpoint records its SHA-256)")
        if sha256_file(f) != digest:
            raise CheckpointError(f"{f} was edited after saving (its SHA-256 does not match {CONFIG_NAME}); {TRUST_HINT}")


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


class TensorFile(CheckpointReader):
    """Lazy reads from the one tensors file a checkpoint records (never a stray ``*.safetensors``
    beside it); a read the file cannot serve (truncated, trusted past its size check) is a
    :class:`CheckpointError`."""

    def __init__(self, file: Path):
        from safetensors import SafetensorError, safe_open

        self.file = file
        try:
            self._handles = [safe_open(str(file), framework="pt")]
        except (SafetensorError, OSError, ValueError) as e:
            raise CheckpointError(f"{file} is truncated or corrupt: {e}") from e
        self._where = {k: self._handles[0] for k in self._handles[0].keys()}

    def names(self) -> list[str]:
        return list(self._where)

    def full(self, name: str) -> torch.Tensor:
        if name not in self._where:
            raise KeyError(f"tensor {name!r} is not in the checkpoint")
        from safetensors import SafetensorError

        try:
            return self._where[name].get_tensor(name)
        except (SafetensorError, OSError, ValueError, RuntimeError) as e:
            raise CheckpointError(f"{self.file} is truncated or corrupt (reading {name}): {e}") from e


@dataclass
class OpenedCheckpoint:
    """A verified checkpoint folder: its lowbit config, scheme, the base model's config and the
    tensors file, opened for lazy reads."""

    path: Path
    meta: dict
    scheme: Scheme
    config: object  # transformers.PretrainedConfig
    tensors: TensorFile

    @property
    def layout(self) -> dict:
        return self.meta.get("layout", {})


def open_folder(path: str | os.PathLike, sha256: bool = True, trust_edits: bool | None = None) -> OpenedCheckpoint:
    """Read and verify a checkpoint folder (see :func:`open_checkpoint`), its ``config.json`` too."""
    from transformers import AutoConfig

    path = Path(path)
    meta, scheme, wpath = open_checkpoint(path, sha256, trust_edits)
    try:
        config = AutoConfig.from_pretrained(path)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path}: config.json is missing or unreadable: {' '.join(str(e).split())[:300]}") from e
    return OpenedCheckpoint(path, meta, scheme, config, TensorFile(wpath))
