"""Float models and their architectures: loading (default, folder, GGUF, hub cache), the
architecture adapters and the tensor-parallel shard plan, activation capture, lazy layers."""

from .loading import DEFAULT_NAMES, ModelNotFoundError, load_tokenizer

__all__ = ["DEFAULT_NAMES", "ModelNotFoundError", "load_tokenizer"]
