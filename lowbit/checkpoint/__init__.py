"""Quantized checkpoints: lowbit's own (safetensors + ``lowbit_config.json``, hashed against each
other, written atomically) and compressed-tensors ones, opened onto lowbit's modules.

``load_model`` opens anything ``--model`` names (a checkpoint or a float model).
"""

from .load import load_quantized
from .opener import CONFIG_NAME, FORMAT_VERSION, WEIGHTS_NAME, is_quantized_dir, open_checkpoint, open_folder, read_meta
from .open_model import load_model
from .save import check_save_target, save_quantized

__all__ = ["save_quantized", "check_save_target", "load_quantized", "open_checkpoint", "open_folder", "is_quantized_dir",
           "read_meta", "load_model", "FORMAT_VERSION", "CONFIG_NAME", "WEIGHTS_NAME"]
