"""Quantization recipes: schemes as data, calibration, reorder, GPTQ, smoothing, clipping."""
