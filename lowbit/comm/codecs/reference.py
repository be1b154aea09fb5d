"""Reference encoder/decoder: plain code built on ``lowbit.formats``, the yardstick for the fast one.

Per 32-value block, by ``lowbit.formats``: integer codecs take scale = signed_absmax / -2^(b-1)
stored as fp16 rounded away from zero (an all-zero block gets scale 1), codes =
clamp(round_half_even(x / scale)) + 2^(b-1); FP4 takes scale = fp16(absmax / 6) and E2M1 codes. A block whose scale is not a finite fp16 (NaN/Inf in
the block, or values beyond the fp16 scale range) is *poisoned*: scale NaN, codes 0, so it
decodes to NaN and no other block is touched.
"""

from __future__ import annotations

import torch

from lowbit.formats import (
    PerGroup, QParams, choose_qparams, dequantize, e2m1_decode, fp4_quantize, pack, quantize, unpack,
)

from .spec import BLOCK, BLOCKS_PER_ROW, ROW, Codec, check_dtype, fp_wire_dtype, get_codec, n_rows


def _rows(x: torch.Tensor) -> torch.Tensor:
    flat = x.reshape(-1)
    pad = n_rows(flat.numel()) * ROW - flat.numel()
    return torch.nn.functional.pad(flat, (0, pad)).reshape(-1, ROW)


def _encode_block(b: torch.Tensor, c: Codec) -> tuple[torch.Tensor, torch.Tensor]:
    """(uint8 codes, fp16 scale) of one finite block, by the formats' own functions.

    Raises ValueError when the scale does not fit in fp16 (the formats refuse it).
    """
    if c.kind == "int":
        qp = choose_qparams(b, c.bits, granularity=PerGroup(BLOCK), scale_dtype=torch.float16)
        codes = (quantize(b, qp).to(torch.int16) + c.bias).to(torch.uint8)
        return codes, qp.scale.reshape(())
    q = fp4_quantize(b, "fp16", BLOCK)
    return q.codes, q.scale.to(torch.float16).reshape(())


def encode_ref(x: torch.Tensor, codec: str | Codec, *, fp_wire: torch.dtype | None = None) -> torch.Tensor:
    """Wire bytes ``[rows, row_bytes]`` of ``x`` (any shape, flattened, zero padded to rows).

    FP codec: the values as ``fp_wire`` (default: x's own dtype, i.e. the raw bytes)."""
    c = get_codec(codec)
    check_dtype(x.dtype)
    rows = _rows(x)
    if c.kind == "fp":
        wd = fp_wire or fp_wire_dtype(x.dtype)
        return rows.to(wd).contiguous().view(torch.uint8).reshape(rows.shape[0], c.wire_row_bytes(wd))
    codes, scales = [], []
    for b in rows.float().reshape(-1, BLOCK):  # one block at a time: plain and obviously right
        try:
            if not bool(torch.isfinite(b).all()):
                raise ValueError("non-finite block")
            q, s = _encode_block(b, c)
        except ValueError:  # poisoned block: NaN scale, zero codes
            q, s = torch.zeros(BLOCK, dtype=torch.uint8), torch.tensor(float("nan"), dtype=torch.float16)
        codes.append(q)
        scales.append(s)
    packed = pack(torch.stack(codes).reshape(-1, ROW), c.bits)
    scale_bytes = torch.stack(scales).reshape(-1, BLOCKS_PER_ROW).contiguous().view(torch.uint8)
    return torch.cat([packed, scale_bytes], dim=1)


def decode_ref(
    wire: torch.Tensor, codec: str | Codec, n: int, dtype: torch.dtype, *, fp_wire: torch.dtype | None = None
) -> torch.Tensor:
    """The first ``n`` values of the wire rows, as ``dtype``, flat."""
    c = get_codec(codec)
    check_dtype(dtype)
    if c.kind == "fp":
        wd = fp_wire or fp_wire_dtype(dtype)
        vals = wire.reshape(-1, c.wire_row_bytes(wd)).contiguous().view(wd).reshape(-1)
        return vals[:n].to(dtype)
    rows = wire.reshape(-1, c.row_bytes)
    codes = unpack(rows[:, : c.code_bytes].contiguous(), c.bits, ROW).reshape(-1, BLOCK)
    scale = rows[:, c.code_bytes :].contiguous().view(torch.float16).reshape(-1)
    if c.kind == "int":
        q = codes.to(torch.int16) - c.bias
        qp = QParams(scale, None, c.bits, True, True, PerGroup(BLOCK))
        vals = dequantize(q.reshape(-1), qp, torch.float32)
    else:
        vals = (e2m1_decode(codes) * scale.float()[:, None]).reshape(-1)
    return vals.reshape(-1)[:n].to(dtype)
