"""The all-reduce wire formats: names, bit widths and the exact bytes of one row.

A row is 2048 values: first the codes (bit planes, see ``lowbit.formats.packing``), then the
64 FP16 scales of its 32-value blocks. The FP codec sends the raw values in the input's own dtype
instead (fp16/bf16: 4096 bytes per row, fp32: 8192), so it is exact up to summation order.
A flat tensor is padded with zeros to whole rows; zeros never change a block's scale.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lowbit.formats import packed_size

ROW = 2048
BLOCK = 32
BLOCKS_PER_ROW = ROW // BLOCK
SCALE_BYTES = BLOCKS_PER_ROW * 2  # one float16 per block
FP16_MAX = 65504.0


@dataclass(frozen=True)
class Codec:
    """One wire format. ``kind`` is "fp" (raw values), "int" (symmetric integer) or "fp4" (E2M1).

    ``code_bytes`` / ``row_bytes`` are the sizes for 16-bit input; ``wire_row_bytes(dtype)`` is the
    size for any input dtype (only the FP codec's depends on it).
    """

    name: str
    kind: str
    bits: int

    @property
    def code_bytes(self) -> int:
        """Bytes of the codes of one row of 16-bit input (the FP codec has no separate scales)."""
        return self.wire_code_bytes(torch.bfloat16)

    @property
    def row_bytes(self) -> int:
        """Bytes of one row of 16-bit input; see :meth:`wire_row_bytes` for float32."""
        return self.wire_row_bytes(torch.bfloat16)

    def wire_code_bytes(self, dtype: torch.dtype) -> int:
        """Bytes of the codes of one row whose values travel as ``dtype`` (FP codec: 2 or 4 per value)."""
        if self.kind == "fp":
            check_dtype(dtype)
            return ROW * _ELEM_SIZE[dtype]
        return packed_size(ROW, self.bits)

    def wire_row_bytes(self, dtype: torch.dtype) -> int:
        """Exact bytes of one wire row for ``dtype`` values: FP 4096 (fp16/bf16) or 8192 (fp32),
        INT8 2176, INT6 1664, INT4 1152, INT3 896, FP4 1152 whatever the dtype."""
        return self.wire_code_bytes(dtype) + (0 if self.kind == "fp" else SCALE_BYTES)

    @property
    def qmin(self) -> int:
        return -(2 ** (self.bits - 1))

    @property
    def qmax(self) -> int:
        return 2 ** (self.bits - 1) - 1

    @property
    def bias(self) -> int:
        """Added to signed integer codes to make them unsigned for packing."""
        return 2 ** (self.bits - 1)

    def ratio(self, dtype: torch.dtype = torch.bfloat16) -> float:
        """Bytes of the input over bytes on the wire (fp16/bf16 input: FP4/INT4 3.56x; FP always 1x)."""
        check_dtype(dtype)
        return ROW * _ELEM_SIZE[dtype] / self.wire_row_bytes(dtype)


CODECS: dict[str, Codec] = {
    "fp": Codec("fp", "fp", 16),
    "int8": Codec("int8", "int", 8),
    "int6": Codec("int6", "int", 6),
    "int4": Codec("int4", "int", 4),
    "int3": Codec("int3", "int", 3),
    "fp4": Codec("fp4", "fp4", 4),
}

INPUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_ELEM_SIZE = {torch.float16: 2, torch.bfloat16: 2, torch.float32: 4}


def get_codec(codec: str | Codec) -> Codec:
    if isinstance(codec, Codec):
        return codec
    try:
        return CODECS[str(codec).lower()]
    except KeyError:
        raise ValueError(f"unknown codec {codec!r}; choose one of {', '.join(CODECS)}") from None


def fp_wire_dtype(dtype: torch.dtype) -> torch.dtype:
    """The FP codec's wire dtype for ``dtype`` input: the dtype itself (raw values, no rounding).

    float32 used to travel as bf16, which made the ``fp`` all-reduce differ from ``dist.all_reduce``
    by ~1e-3 relative; callers may still ask for another wire with ``fp_wire=``.
    """
    check_dtype(dtype)
    return dtype


def check_dtype(dtype: torch.dtype) -> None:
    if dtype not in INPUT_DTYPES:
        raise TypeError(f"all-reduce codecs take float16, bfloat16 or float32, got {dtype}")


def n_rows(n: int) -> int:
    return -(-n // ROW)
