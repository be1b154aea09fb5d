"""Atom-style low-bit quantization of Llama-like models: one call applies a scheme (pure data,
in lowbit.formats.scheme) to a model: calibration, smoothing, outlier reordering, GPTQ or RTN."""

from lowbit.formats.scheme import ActArgs, GPTQArgs, KVArgs, OutlierArgs, Scheme, SchemeError, SmoothArgs, TPArgs, WeightArgs

from .apply import QuantizeReport, quantize_model
from .presets import PRESETS, get_scheme

__all__ = ["quantize_model", "QuantizeReport", "PRESETS", "get_scheme", "Scheme", "SchemeError",
           "WeightArgs", "ActArgs", "OutlierArgs", "KVArgs", "GPTQArgs", "SmoothArgs", "TPArgs"]
