"""Reference encoder/decoder: plain code built on ``lowbit.formats``, the yardstick for the fast one.

Per 32-value block, by ``lowbit.formats``: integer codecs take scale = signed_absmax / -2^(b-1)
(of two equal magnitudes the first)
stored as fp16 rounded away from zero (an all-zero block gets scale 1), codes =
clamp(round_half_even(x / scale)) + 2^(b-1); FP4 takes scale = fp16(absmax / 6) and E2M1 codes.
A finite block whose scale does not fit fp16 gets an *extended* scale (``extscale.py``), written
out plainly here. A block with NaN/Inf is *poisoned*: scale NaN, codes 0, so it decodes to NaN
and no other block is touched. Decoding to float16 saturates |v| in (65504, 65536) to ±65504.
"""

from __future__ import annotations

import math

import torch

from lowbit.formats import (
    E2M1_VALUES, PerGroup, QParams, choose_qparams, dequantize, e2m1_decode, fp4_quantize, pack, quantize, unpack,
)

from . import extscale
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
        # ties="first": of +a and -a the first sets the scale, as the fast and C codecs do
        qp = choose_qparams(b, c.bits, granularity=PerGroup(BLOCK), scale_dtype=torch.float16, ties="first")
        codes = (quantize(b, qp).to(torch.int16) + c.bias).to(torch.uint8)
        return codes, qp.scale.reshape(())
    q = fp4_quantize(b, "fp16", BLOCK)
    return q.codes, q.scale.to(torch.float16).reshape(())


def _e2m1_index(a: float) -> int:
    """E2M1 magnitude code of |v| = a: the nearest grid value, ties to the even code."""
    return min(range(8), key=lambda i: (abs(E2M1_VALUES[i] - a), i % 2))


def _encode_block_ext(b: torch.Tensor, c: Codec) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes, fp16-bits scale) of a finite block beyond the fp16 scale range, value by value."""
    if c.kind == "int":
        s32 = float(b[int(b.abs().argmax())] / c.qmin)  # float32 divide, as the formats do
    else:
        s32 = float(b.abs().max() / 6.0)
    bits, s = extscale.encode_py(s32)
    cap = extscale.code_cap_py(s)
    codes = []
    for v in (b / torch.tensor(s, dtype=torch.float32)).tolist():  # float32 quotients
        if c.kind == "int":
            q = min(max(round(v), c.qmin, -math.floor(cap)), c.qmax, math.floor(cap))  # round: half to even
            codes.append(q + c.bias)
        else:
            g = 6.0 if cap >= 6.0 else 4.0
            v = min(max(v, -g), g)
            codes.append(_e2m1_index(abs(v)) | (8 if v < 0 else 0))
    return torch.tensor(codes, dtype=torch.uint8), torch.tensor(bits - (0x10000 if bits & 0x8000 else 0),
                                                                dtype=torch.int16).view(torch.float16)


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
        if not bool(torch.isfinite(b).all()):  # poisoned block: NaN scale, zero codes
            q, s = torch.zeros(BLOCK, dtype=torch.uint8), torch.tensor(float("nan"), dtype=torch.float16)
        else:
            try:
                q, s = _encode_block(b, c)
            except ValueError:  # the scale does not fit fp16
                q, s = _encode_block_ext(b, c)
            if not bool(torch.isfinite(s)) and not extscale.is_ext_py(int(s.view(torch.int16)) & 0xFFFF):
                q, s = _encode_block_ext(b, c)  # fp16 rounding overflowed without the formats noticing
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
        vals = dequantize(q.reshape(-1), qp, torch.float32).reshape(-1, BLOCK)
    else:
        vals = e2m1_decode(codes) * scale.float()[:, None]
    for i, bits in enumerate(scale.view(torch.int16).tolist()):  # extended scales, one block at a time
        if extscale.is_ext_py(bits & 0xFFFF):
            s = extscale.value_py(bits & 0xFFFF)
            step = (codes[i].float() - c.bias) if c.kind == "int" else e2m1_decode(codes[i])
            vals[i] = step * s  # exact in float32: codes have 8 bits at most, s 3
        elif extscale.is_void_py(bits & 0xFFFF):  # fp16 inf, NaN or bits no encoder writes
            vals[i] = float("nan")
    vals = vals.reshape(-1)[:n]
    if dtype == torch.float16:
        vals = torch.where(vals.abs() < 65536.0, vals.clamp(-65504.0, 65504.0), vals)
    return vals.to(dtype)
