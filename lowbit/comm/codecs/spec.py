"""The all-reduce wire formats: names, bit widths and the exact bytes of one row.

A row is 2048 values: first the codes (bit planes, see ``lowbit.formats.packing``), then the
64 FP16 scales of its 32-value blocks. The FP codec sends the raw 16-bit values instead.
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
    """One wire format. ``kind`` is "fp" (raw 16-bit), "int" (symmetric integer) or "fp4" (E2M1)."""

    name: str
    kind: str
    bits: int

    @property
    def code_bytes(self) -> int:
        """Bytes of the codes of one row (the FP codec has no separate scales)."""
        if self.kind == "fp":
            return ROW * 2
        return packed_size(ROW, self.bits)

    @property
    def row_bytes(self) -> int:
        return self.code_bytes + (0 if self.kind == "fp" else SCALE_BYTES)

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
        """Bytes of the input over bytes on the wire (fp16/bf16 input: FP4/INT4 3.56x)."""
        return ROW * torch.tensor([], dtype=dtype).element_size() / self.row_bytes


CODECS: dict[str, Codec] = {
    "fp": Codec("fp", "fp", 16),
    "int8": Codec("int8", "int", 8),
    "int6": Codec("int6", "int", 6),
    "int4": Codec("int4", "int", 4),
    "int3": Codec("int3", "int", 3),
    "fp4": Codec("fp4", "fp4", 4),
}

INPUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def get_codec(codec: str | Codec) -> Codec:
    if isinstance(codec, Codec):
        return codec
    try:
        return CODECS[str(codec).lower()]
    except KeyError:
        raise ValueError(f"unknown codec {codec!r}; choose one of {', '.join(CODECS)}") from None


def fp_wire_dtype(dtype: torch.dtype) -> torch.dtype:
    """16-bit dtype of the FP codec's wire: fp16 and bf16 as they are, fp32 as bf16 (keeps range)."""
    check_dtype(dtype)
    return torch.float16 if dtype == torch.float16 else torch.bfloat16


def check_dtype(dtype: torch.dtype) -> None:
    if dtype not in INPUT_DTYPES:
        raise TypeError(f"all-reduce codecs take float16, bfloat16 or float32, got {dtype}")


def n_rows(n: int) -> int:
    return -(-n // ROW)
