"""All-reduce wire codecs: FP (raw 16-bit), INT8/6/4/3 and FP4, 2048-value rows with FP16 block scales."""

from .fast import decode, decode_add, decode_torch, encode, encode_torch, reduce_encode
from .reference import decode_ref, encode_ref
from .spec import BLOCK, CODECS, ROW, Codec, CodecSpec, fp_wire_dtype, get_codec, n_rows, parse_spec

__all__ = [
    "encode", "decode", "decode_add", "reduce_encode", "encode_torch", "decode_torch", "encode_ref", "decode_ref", "Codec", "CODECS", "get_codec", "CodecSpec", "parse_spec", "fp_wire_dtype",
    "ROW", "BLOCK", "n_rows",
]
