"""Quantized checkpoints on disk: safetensors + ``lowbit_config.json``, hashed against each other,
written atomically."""

from .checkpoint import (CONFIG_NAME, FORMAT_VERSION, WEIGHTS_NAME, CheckpointError, is_quantized_dir,
                         load_quantized, open_checkpoint, read_meta)
from .save import check_save_target, save_quantized

__all__ = ["save_quantized", "check_save_target", "load_quantized", "open_checkpoint", "is_quantized_dir",
           "read_meta", "CheckpointError", "FORMAT_VERSION", "CONFIG_NAME", "WEIGHTS_NAME"]
