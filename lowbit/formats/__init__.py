"""Number formats: affine integers, FP4, FP8, bit packing and accounting. Pure functions."""

from .affine import QParams, choose_qparams, dequantize, fake_quantize, qrange, quantize
from .fp4 import E2M1_VALUES, FP4Blocks, e2m1_decode, e2m1_encode, fp4_dequantize, fp4_quantize
from .fp8 import fp8_dequantize, fp8_quantize
from .granularity import PerChannel, PerGroup, PerTensor, PerToken, from_blocks, n_blocks, to_blocks
from .metrics import sqnr_db
from .packing import pack, packed_size, planes, unpack
from .spec import FP4Format, FP8Format, IntFormat, effective_bits

__all__ = [
    "QParams", "choose_qparams", "quantize", "dequantize", "fake_quantize", "qrange",
    "E2M1_VALUES", "FP4Blocks", "e2m1_encode", "e2m1_decode", "fp4_quantize", "fp4_dequantize",
    "fp8_quantize", "fp8_dequantize",
    "PerTensor", "PerChannel", "PerGroup", "PerToken", "to_blocks", "from_blocks", "n_blocks",
    "sqnr_db", "pack", "unpack", "packed_size", "planes",
    "IntFormat", "FP4Format", "FP8Format", "effective_bits",
]
