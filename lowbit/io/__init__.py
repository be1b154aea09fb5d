"""Quantized checkpoints on disk: safetensors + ``lowbit_config.json``, written atomically."""

from .checkpoint import (CONFIG_NAME, FORMAT_VERSION, WEIGHTS_NAME, CheckpointError, is_quantized_dir,
                         load_quantized, read_meta, save_quantized)

__all__ = ["save_quantized", "load_quantized", "is_quantized_dir", "read_meta", "CheckpointError",
           "FORMAT_VERSION", "CONFIG_NAME", "WEIGHTS_NAME"]
