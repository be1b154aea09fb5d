"""lowbit: low-bit numbers for serving LLMs (weights, activations, KV cache, all-reduce)."""

__version__ = "0.1.0"
