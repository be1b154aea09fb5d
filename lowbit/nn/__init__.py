"""Quantized modules: packed linears, a packed KV cache, permuted norms, unfused experts.

The KV cache names load on first use: they import transformers' cache classes, which vLLM's
processes (where the plugin reads QuantLinear layouts) have no use for."""

from lowbit.nn.quantized_activation import QuantizedActivation, quantize_activation
from .experts import UnfusedExperts
from .permuted_norm import PermutedNorm
from .quant_linear import QuantLinear, QuantLinearLayout, module_bytes
from .reference_matmul import reference_quant_matmul
from .row_sharded import RowShardedLinear

__all__ = ["QuantLinear", "QuantLinearLayout", "module_bytes", "PackedKVCache", "install_kv_quantization",
           "PermutedNorm", "UnfusedExperts", "QuantizedActivation", "quantize_activation", "reference_quant_matmul",
           "RowShardedLinear"]


def __getattr__(name: str):
    if name in ("PackedKVCache", "install_kv_quantization"):
        from . import kv_cache

        return getattr(kv_cache, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
