"""Quantized modules: packed linears, a packed KV cache, permuted norms, unfused experts."""

from lowbit.nn.quantized_activation import QuantizedActivation, quantize_activation
from .experts import UnfusedExperts
from .kv_cache import PackedKVCache, install_kv_quantization
from .permuted_norm import PermutedNorm
from .quant_linear import QuantLinear, QuantLinearLayout, module_bytes
from .reference_matmul import reference_quant_matmul
from .row_sharded import RowShardedLinear

__all__ = ["QuantLinear", "QuantLinearLayout", "module_bytes", "PackedKVCache", "install_kv_quantization",
           "PermutedNorm", "UnfusedExperts", "QuantizedActivation", "quantize_activation", "reference_quant_matmul",
           "RowShardedLinear"]
