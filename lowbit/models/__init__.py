"""Model loading and architecture adapters."""

from .loading import DEFAULT_NAMES, ModelNotFoundError, load_model, load_tokenizer

__all__ = ["DEFAULT_NAMES", "ModelNotFoundError", "load_model", "load_tokenizer"]
