"""Atom-style low-bit quantization of Llama-like models: schemes as data, one call to apply.

``quantize_model`` is imported lazily: it needs :mod:`lowbit.nn`, which itself uses this
package's number grids.
"""

from .presets import PRESETS, get_scheme
from .scheme import ActArgs, GPTQArgs, KVArgs, OutlierArgs, Scheme, SchemeError, SmoothArgs, TPArgs, WeightArgs


def __getattr__(name):
    if name in ("quantize_model", "QuantizeReport"):
        from . import apply

        return getattr(apply, name)
    raise AttributeError(f"module 'lowbit.quantize' has no attribute {name!r}")


__all__ = ["quantize_model", "QuantizeReport", "PRESETS", "get_scheme", "Scheme", "SchemeError",
           "WeightArgs", "ActArgs", "OutlierArgs", "KVArgs", "GPTQArgs", "SmoothArgs", "TPArgs"]
