"""Fused Triton codecs for CUDA tensors: INT8 and INT4 encode, decode and decode-sum-encode.

The torch codec (``fast.encode_torch``) is a chain of ~20 small kernels per call; here one program
handles one 2048-value row (64 blocks of 32) in registers: scale, codes, packing and the FP16
scale bytes in a single pass, and the two-shot's middle step (decode W rows, add in float32 in
rank order, re-encode) without writing the sum to memory.

Bit-identical to ``reference.py`` (tested under TRITON_INTERPRET=1 on CPU): the signed absmax
is the first value of largest magnitude (a +m/-m tie: the earlier one, as the fast and C codecs), the scale is
fp32 ``signed_max / qmin`` (a power of two: exact), rounded to fp16 away from zero, 1 for an
all-zero block; codes are round-half-even of the correctly rounded fp32 quotient (``div_rn``);
a finite block beyond the fp16 scale range gets the extended scale (``extscale.py``) with codes
capped within bfloat16; a block with NaN/Inf gets scale NaN (0x7E00) and codes 0.
Decoding to float16 saturates |v| in (65504, 65536) to ±65504, as the reference; decoded values
equal the reference's bit for bit except NaN payloads (a poisoned block is NaN in both).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .spec import ROW, Codec, check_dtype, get_codec, n_rows

SUPPORTED = ("int8", "int4")
_BF16_MAX = tl.constexpr(3.3895313892515355e38)  # the largest finite bfloat16, exact in fp32
_OUT = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
# warps per 2048-value row for each kernel (any width gives the same bits; a tuning knob)
WARPS = {"encode": 4, "decode": 2, "reduce": 2}  # H200: scripts/gpu_check.sh, README


@triton.jit
def _rint(v):
    """Round half to even, exact for |v| < 2^23 (v - floor(v) is exact there)."""
    r = tl.floor(v)
    f = v - r
    odd = (r - 2.0 * tl.floor(r * 0.5)) != 0.0
    return tl.where((f > 0.5) | ((f == 0.5) & odd), r + 1.0, r)


@triton.jit
def _interleave(e, o):
    """[64, 16] even and odd values → [64, 32] in row order (e0 o0 e1 o1 ...)."""
    return tl.reshape(tl.join(e, o), (64, 32))


@triton.jit
def _deinterleave(v):
    """[64, 32] in row order → its even and odd values, [64, 16] each."""
    return tl.split(tl.reshape(v, (64, 16, 2)))


@triton.jit
def _encode_tile(xe, xo, BITS: tl.constexpr):
    """Codes (even and odd values, int32 [64, 16]) and fp16 scale bits (int32 [64]) of one row."""
    QMIN: tl.constexpr = -(1 << (BITS - 1))
    QMAX: tl.constexpr = (1 << (BITS - 1)) - 1
    fin_e = (xe == xe) & (tl.abs(xe) != float("inf"))
    fin_o = (xo == xo) & (tl.abs(xo) != float("inf"))
    bad = (tl.sum((~fin_e).to(tl.int32), axis=1) + tl.sum((~fin_o).to(tl.int32), axis=1)) > 0
    ze = tl.where(fin_e, xe, 0.0)
    zo = tl.where(fin_o, xo, 0.0)
    hi = tl.maximum(tl.max(ze, axis=1), tl.max(zo, axis=1))
    lo = tl.minimum(tl.min(ze, axis=1), tl.min(zo, axis=1))
    # the signed absmax is the *first* value of largest magnitude (a +m/-m tie: the earlier one)
    amax = tl.maximum(hi, -lo)[:, None]
    pair = tl.arange(0, 16)[None, :]
    first = tl.minimum(tl.min(tl.where(tl.abs(ze) == amax, 2 * pair, 64), axis=1),
                       tl.min(tl.where(tl.abs(zo) == amax, 2 * pair + 1, 64), axis=1))[:, None]
    fval = tl.sum(tl.where(2 * pair == first, ze, 0.0), axis=1) + tl.sum(tl.where(2 * pair + 1 == first, zo, 0.0), axis=1)
    s32 = fval * (1.0 / QMIN)  # exact: a power of two
    h = s32.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    hv = h.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    h = tl.where(tl.abs(hv) < tl.abs(s32), h + 1, h)  # never shrink: the next fp16 away from zero
    ext = (h & 0x7FFF) >= 0x7C00  # rounded to inf: beyond the fp16 range
    b = s32.to(tl.int32, bitcast=True)
    mag = ((b & 0x7FFFFFFF) + 0x1FFFFF) & 0x7FE00000
    p = (tl.minimum(tl.maximum((mag >> 23) - 142, 1), 0x7F) << 2) | ((mag >> 21) & 3)
    neg = b < 0
    ext_h = (p | 0x7C00) | tl.where(neg, 0x8000, 0)
    ext_v = mag.to(tl.float32, bitcast=True)
    ext_v = tl.where(neg, -ext_v, ext_v)
    h = tl.where((h & 0x7FFF) == 0, 0x3C00, h)  # an all-zero block: scale 1
    hv = h.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    s = tl.where(ext, ext_v, hv)
    s = tl.where(bad, 1.0, s)
    h = tl.where(ext, ext_h, h)
    h = tl.where(bad, 0x7E00, h)
    cap = tl.floor(tl.math.div_rn(tl.zeros_like(s) + _BF16_MAX, tl.abs(s)))
    lo_c = tl.maximum(-cap, QMIN * 1.0)[:, None]
    hi_c = tl.minimum(cap, QMAX * 1.0)[:, None]
    qe = tl.minimum(tl.maximum(_rint(tl.math.div_rn(ze, s[:, None])), lo_c), hi_c) - QMIN
    qo = tl.minimum(tl.maximum(_rint(tl.math.div_rn(zo, s[:, None])), lo_c), hi_c) - QMIN
    qe = tl.where(bad[:, None], 0, qe.to(tl.int32))
    qo = tl.where(bad[:, None], 0, qo.to(tl.int32))
    return qe, qo, h


@triton.jit
def _store_row(wire_ptr, row, qe, qo, h, RB: tl.constexpr, CODE_BYTES: tl.constexpr, BITS: tl.constexpr):
    blk = tl.arange(0, 64)
    pair = tl.arange(0, 16)
    base = wire_ptr + row.to(tl.int64) * RB
    if BITS == 8:  # even and odd codes interleaved in registers: one contiguous store
        tl.store(base + blk[:, None] * 32 + tl.arange(0, 32)[None, :], _interleave(qe, qo).to(tl.uint8))
    else:
        tl.store(base + blk[:, None] * 16 + pair[None, :], (qe | (qo << 4)).to(tl.uint8))
    tl.store(base + CODE_BYTES + 2 * blk, (h & 0xFF).to(tl.uint8))
    tl.store(base + CODE_BYTES + 2 * blk + 1, ((h >> 8) & 0xFF).to(tl.uint8))


@triton.jit
def _load_row(wire_ptr, row, RB: tl.constexpr, CODE_BYTES: tl.constexpr, BITS: tl.constexpr):
    """The fp32 values of one wire row, even and odd positions [64, 16]."""
    BIAS: tl.constexpr = 1 << (BITS - 1)
    blk = tl.arange(0, 64)
    pair = tl.arange(0, 16)
    base = wire_ptr + row.to(tl.int64) * RB
    if BITS == 8:  # one contiguous load, split into even and odd codes in registers
        ce, co = _deinterleave(tl.load(base + blk[:, None] * 32 + tl.arange(0, 32)[None, :]).to(tl.int32))
    else:
        byte = tl.load(base + blk[:, None] * 16 + pair[None, :]).to(tl.int32)
        ce = byte & 15
        co = byte >> 4
    h = tl.load(base + CODE_BYTES + 2 * blk).to(tl.int32) | (tl.load(base + CODE_BYTES + 2 * blk + 1).to(tl.int32) << 8)
    p = h & 0x1FF
    ext = ((h & 0x7E00) == 0x7C00) & ((p >> 2) >= 1) & ((p >> 2) <= 112)  # extscale.EXT_STEPS
    ev = (((p >> 2) + 142) << 23 | ((p & 3) << 21)).to(tl.float32, bitcast=True)
    ev = tl.where((h & 0x8000) != 0, -ev, ev)
    hv = tl.where((h & 0x7C00) == 0x7C00, float("nan"), h.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32))
    s = tl.where(ext, ev, hv)[:, None]
    return (ce - BIAS).to(tl.float32) * s, (co - BIAS).to(tl.float32) * s


@triton.jit
def _bf16_bits(v):
    """float32 -> bfloat16 bits (int16), round to nearest even, NaN as 0x7FC0 (the same on every
    backend: the interpreter's own cast truncates)."""
    b = v.to(tl.int32, bitcast=True)
    r = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) & 0xFFFF
    return tl.where(v != v, 0x7FC0, r).to(tl.int16)


@triton.jit
def _sat16(v):
    """float16-bound values: |v| in (65504, 65536) becomes ±65504; NaN stays NaN."""
    near = tl.abs(v) < 65536.0
    return tl.where(near & (v > 65504.0), 65504.0, tl.where(near & (v < -65504.0), -65504.0, v))


@triton.jit
def _row_index(row):
    """Element indices of one 2048-value row as [64 blocks, 32 values], contiguous per block."""
    return row.to(tl.int64) * 2048 + tl.arange(0, 64)[:, None] * 32 + tl.arange(0, 32)[None, :]


@triton.jit
def _encode_kernel(x_ptr, wire_ptr, n, RB: tl.constexpr, CODE_BYTES: tl.constexpr, BITS: tl.constexpr):
    row = tl.program_id(0)
    idx = _row_index(row)
    xe, xo = _deinterleave(tl.load(x_ptr + idx, mask=idx < n, other=0.0).to(tl.float32))
    qe, qo, h = _encode_tile(xe, xo, BITS)
    _store_row(wire_ptr, row, qe, qo, h, RB, CODE_BYTES, BITS)


@triton.jit
def _decode_kernel(wire_ptr, out_ptr, n, RB: tl.constexpr, CODE_BYTES: tl.constexpr, BITS: tl.constexpr,
                   OUT: tl.constexpr):
    row = tl.program_id(0)
    ve, vo = _load_row(wire_ptr, row, RB, CODE_BYTES, BITS)
    idx = _row_index(row)
    if OUT == 2:
        ve = _sat16(ve)
        vo = _sat16(vo)
    if OUT == 1:  # bfloat16 written as its bits (out_ptr is int16): rounded to nearest even here
        tl.store(out_ptr + idx, _interleave(_bf16_bits(ve), _bf16_bits(vo)), mask=idx < n)
    else:
        tl.store(out_ptr + idx, _interleave(ve, vo).to(out_ptr.dtype.element_ty), mask=idx < n)


@triton.jit
def _reduce_kernel(wires_ptr, out_ptr, world, rows, clamp, RB: tl.constexpr, CODE_BYTES: tl.constexpr,
                   BITS: tl.constexpr, F16: tl.constexpr):
    """out row = encode(sum_j decode(wires[j] row)), float32 sums in j order (fp16: bounded)."""
    row = tl.program_id(0)
    se, so = _load_row(wires_ptr, row, RB, CODE_BYTES, BITS)
    if F16:
        se = _sat16(se)
        so = _sat16(so)
    for j in range(1, world):
        ve, vo = _load_row(wires_ptr, row + j * rows, RB, CODE_BYTES, BITS)
        if F16:
            ve = _sat16(ve)
            vo = _sat16(vo)
        se += ve
        so += vo
    if F16:  # as fast.fp16_sums: an overflowing sum becomes ±clamp, one within a step of it ±65504
        se = tl.where(tl.abs(se) >= 65520.0, tl.where(se < 0, -clamp, clamp),
                      tl.where(se > 65504.0, 65504.0, tl.where(se < -65504.0, -65504.0, se)))
        so = tl.where(tl.abs(so) >= 65520.0, tl.where(so < 0, -clamp, clamp),
                      tl.where(so > 65504.0, 65504.0, tl.where(so < -65504.0, -65504.0, so)))
    qe, qo, h = _encode_tile(se, so, BITS)
    _store_row(out_ptr, row, qe, qo, h, RB, CODE_BYTES, BITS)


def _codec(codec: str | Codec) -> Codec:
    c = get_codec(codec)
    if c.name not in SUPPORTED:
        raise ValueError(f"the Triton codec supports {', '.join(SUPPORTED)}, not {c.name}")
    return c


def encode(x: torch.Tensor, codec: str | Codec, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """Wire bytes ``[rows, row_bytes]`` of ``x`` (flattened, zero padded), as ``reference.encode_ref``."""
    c = _codec(codec)
    check_dtype(x.dtype)
    flat = x.reshape(-1).contiguous()
    rows = n_rows(flat.numel())
    if out is None:
        out = torch.empty(rows, c.row_bytes, dtype=torch.uint8, device=x.device)
    if tuple(out.shape) != (rows, c.row_bytes) or out.dtype != torch.uint8 or not out.is_contiguous():
        raise ValueError(f"encode: out must be contiguous uint8 {(rows, c.row_bytes)}, got {tuple(out.shape)}")
    if rows:
        _encode_kernel[(rows,)](flat, out, flat.numel(), RB=c.row_bytes, CODE_BYTES=c.code_bytes, BITS=c.bits,
                                num_warps=WARPS["encode"])
    return out


def decode(wire: torch.Tensor, codec: str | Codec, n: int, dtype: torch.dtype,
           *, out: torch.Tensor | None = None) -> torch.Tensor:
    """The first ``n`` values of the wire rows as ``dtype``, flat, as ``reference.decode_ref``."""
    c = _codec(codec)
    check_dtype(dtype)
    if wire.dtype != torch.uint8 or wire.numel() % c.row_bytes:
        raise ValueError(f"decode: the wire must be whole uint8 rows of {c.row_bytes} bytes")
    rows = wire.numel() // c.row_bytes
    if not 0 <= n <= rows * ROW:
        raise ValueError(f"decode: n = {n} values, the wire holds {rows * ROW}")
    if out is None:
        out = torch.empty(n, dtype=dtype, device=wire.device)
    if out.numel() != n or out.dtype != dtype or not out.is_contiguous():
        raise ValueError(f"decode: out must be contiguous {dtype} of {n} values")
    used = -(-n // ROW)
    if used:
        dst = out.view(torch.int16) if dtype == torch.bfloat16 else out
        _decode_kernel[(used,)](wire.contiguous(), dst, n, RB=c.row_bytes, CODE_BYTES=c.code_bytes, BITS=c.bits,
                                OUT=_OUT[dtype], num_warps=WARPS["decode"])
    return out


def reduce_encode(wires: list[torch.Tensor], codec: str | Codec, *, clamp: float = 0.0,
                  out: torch.Tensor | None = None) -> torch.Tensor:
    """encode(sum of decode(wires[j]) in list order), as ``fast.reduce_encode`` (``clamp`` > 0:
    float16 input, contributions saturated and sums bounded), in one kernel."""
    c = _codec(codec)
    if not wires:
        raise ValueError("reduce_encode: needs at least one wire")
    rows = wires[0].numel() // c.row_bytes
    if any(w.dtype != torch.uint8 or w.numel() != rows * c.row_bytes for w in wires):
        raise ValueError(f"reduce_encode: every wire must be {rows} uint8 rows of {c.row_bytes} bytes")
    stacked = torch.stack([w.reshape(rows, c.row_bytes) for w in wires])
    if out is None:
        out = torch.empty(rows, c.row_bytes, dtype=torch.uint8, device=stacked.device)
    if tuple(out.shape) != (rows, c.row_bytes) or not out.is_contiguous():
        raise ValueError(f"reduce_encode: out must be contiguous uint8 {(rows, c.row_bytes)}")
    if rows:
        _reduce_kernel[(rows,)](stacked, out, len(wires), rows, float(clamp), RB=c.row_bytes,
                                CODE_BYTES=c.code_bytes, BITS=c.bits, F16=clamp > 0, num_warps=WARPS["reduce"])
    return out
