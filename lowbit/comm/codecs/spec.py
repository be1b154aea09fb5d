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
        hint = "; +h / +oN options name a CodecSpec (parse_spec), not a wire codec" if "+" in str(codec) else ""
        raise ValueError(f"unknown codec {codec!r}; choose one of {', '.join(CODECS)}{hint}") from None


HADAMARD_BLOCKS = (32, 64)
DEFAULT_HADAMARD = 64  # measured on the default model's TP 2 all-reduce: see the README


@dataclass(frozen=True)
class CodecSpec:
    """A codec plus what is done around it for hidden-size messages (``int4+h+o16``).

    ``hadamard``: block size of the Hadamard transform applied inside the blocks before encoding
    (0: none); ``outliers``: how many fixed channels travel exactly in the input dtype beside the
    blocks (0: none). See ``lowbit.comm.channels``.
    """

    codec: Codec
    hadamard: int = 0
    outliers: int = 0

    @property
    def name(self) -> str:
        h = "" if not self.hadamard else "+h" if self.hadamard == DEFAULT_HADAMARD else f"+h{self.hadamard}"
        return self.codec.name + h + (f"+o{self.outliers}" if self.outliers else "")

    @property
    def plain_codec(self) -> bool:
        """No transform and no outlier channels: the codec alone, on any message shape."""
        return not self.hadamard and not self.outliers

    def wire_bytes(self, numel: int, dtype: torch.dtype, hidden: int | None = None) -> int:
        """Exact bytes one rank's message of ``numel`` values puts on the wire (one-shot: what each rank
        sends once): whole codec rows for every value, plus the outlier channels in ``dtype``."""
        base = n_rows(numel) * self.codec.wire_row_bytes(dtype)
        if not self.outliers:
            return base
        if not hidden or numel % hidden:
            raise ValueError(f"{self.name}: {numel} values are not whole tokens of hidden size {hidden}")
        return base + numel // hidden * self.outliers * _ELEM_SIZE[dtype]

    def bits_per_value(self, dtype: torch.dtype, hidden: int | None = None) -> float:
        """Wire bits per input value for long messages: the codec's rows, plus ``16 N / hidden``
        for N bf16 outlier channels (16 of 576: +0.44)."""
        check_dtype(dtype)
        extra = 0.0 if not self.outliers else 8.0 * self.outliers * _ELEM_SIZE[dtype] / hidden
        return 8.0 * self.codec.wire_row_bytes(dtype) / ROW + extra


def parse_spec(text: str | Codec | CodecSpec) -> CodecSpec:
    """``int4``, ``int4+h`` (Hadamard in 64-value blocks; ``+h32`` / ``+h64`` choose), ``int4+o16``
    (16 exact channels), combinable in any order (``int4+h+o16``); the one place all-reduce codec
    names are read. ValueError names what is wrong."""
    if isinstance(text, CodecSpec):
        return text
    if isinstance(text, Codec):
        return CodecSpec(text)
    parts = str(text).strip().lower().split("+")
    codec = get_codec(parts[0])
    had = outl = None
    for opt in parts[1:]:
        if opt in ("h", "h32", "h64"):
            if had is not None:
                raise ValueError(f"codec {text!r}: +h given twice")
            had = int(opt[1:]) if len(opt) > 1 else DEFAULT_HADAMARD
        elif opt[:1] == "o" and opt[1:].isdigit():
            if outl is not None:
                raise ValueError(f"codec {text!r}: +oN given twice")
            outl = int(opt[1:])
            if outl < 1:
                raise ValueError(f"codec {text!r}: +oN needs at least one outlier channel")
        else:
            raise ValueError(f"codec {text!r}: unknown option {'+' + opt!r}; options are +h, +h32, +h64 "
                             "(block Hadamard) and +oN (N exact outlier channels)")
    if codec.kind == "fp" and (had or outl):
        raise ValueError(f"codec {text!r}: the fp codec sends raw values already; +h / +oN apply to quantized codecs")
    return CodecSpec(codec, had or 0, outl or 0)


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
