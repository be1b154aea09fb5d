"""Quantized modules: packed linear layers and the quantized KV cache."""
