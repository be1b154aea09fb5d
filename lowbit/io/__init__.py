"""Saving and loading quantized checkpoints (safetensors + JSON), atomically."""
