"""Fast encoder/decoder: the reference's bytes, fused C on CPU, vectorised torch ops elsewhere.

``encode``/``decode`` dispatch: CPU tensors go to the compiled C kernel (``native.py``) when it
builds; CUDA (or LOWBIT_QR_NATIVE=0) uses ``encode_torch``/``decode_torch``, vectorised over
``[rows, 2048]``. All three are tested bit-exact against ``reference.py``.

No Python loop over blocks, no host sync, so the same code runs on CPU and CUDA. Bit-exact to
``reference.py`` (tested): the same fp32 divide, round-half-even and fp16 scale rounding.
"""

from __future__ import annotations

import torch

from lowbit.formats.absmax import store_scale, symmetric_scale
from lowbit.formats.fp4 import e2m1_decode, e2m1_encode

from . import extscale, native
from .bitpack import pack_rows, unpack_rows
from .spec import BLOCK, BLOCKS_PER_ROW, ROW, Codec, check_dtype, fp_wire_dtype, get_codec, n_rows

def as_rows(x: torch.Tensor) -> torch.Tensor:
    """Flat view of ``x`` as ``[rows, 2048]``, zero padded (a copy only when needed)."""
    flat = x.reshape(-1)
    pad = n_rows(flat.numel()) * ROW - flat.numel()
    if pad:
        flat = torch.nn.functional.pad(flat, (0, pad))
    return flat.view(-1, ROW)


def encode_torch(x: torch.Tensor, codec: str | Codec, *, fp_wire: torch.dtype | None = None) -> torch.Tensor:
    """Wire bytes ``[rows, row_bytes]`` of ``x`` with torch ops on x's device; same bytes as ``encode_ref``."""
    c = get_codec(codec)
    check_dtype(x.dtype)
    rows = as_rows(x)
    r = rows.shape[0]
    if c.kind == "fp":
        wire_dtype = fp_wire or fp_wire_dtype(x.dtype)
        return rows.to(wire_dtype).contiguous().view(torch.uint8).view(r, c.wire_row_bytes(wire_dtype))
    blocks = rows.float().view(-1, BLOCK)
    if c.kind == "int":
        scale32 = symmetric_scale(blocks, c.bits)  # the formats' rule: the first absmax wins a tie
        scale16 = store_scale(scale32, torch.float16)  # never shrinks: the grid covers the block
    else:
        scale32 = blocks.abs().amax(dim=1) / 6.0
        scale16 = scale32.to(torch.float16)
    bad = ~torch.isfinite(scale32)  # NaN/Inf in the block: poisoned
    ext = ~bad & ~torch.isfinite(scale16)  # finite, beyond fp16: the extended scale
    ext16, ext32 = extscale.encode(scale32)
    scale16 = torch.where(scale16 == 0, torch.ones_like(scale16), scale16)
    s = torch.where(ext, ext32, scale16.float()).masked_fill_(bad, 1.0).unsqueeze(1)
    scale16 = torch.where(ext, ext16, scale16).masked_fill_(bad, float("nan"))
    cap = extscale.code_cap(s)  # |code| limit keeping every decoded value within bfloat16 range
    scaled = blocks / s
    if c.kind == "int":
        lim = cap.floor_()
        q = scaled.round_().clamp_(torch.clamp(-lim, min=c.qmin), torch.clamp(lim, max=c.qmax)).add_(c.bias)
        q = q.masked_fill_(bad.unsqueeze(1), 0.0)  # NaN rows would convert to garbage
        codes = q.to(torch.uint8)
    else:
        g = extscale.fp4_cap(cap)
        codes = e2m1_encode(scaled.clamp_(-g, g)).masked_fill_(bad.unsqueeze(1), 0)
    out = torch.empty(r, c.row_bytes, dtype=torch.uint8, device=x.device)
    pack_rows(codes.view(r, ROW), c.bits, out[:, : c.code_bytes])
    out[:, c.code_bytes :].copy_(scale16.view(r, BLOCKS_PER_ROW).view(torch.uint8))
    return out


def decode_torch(
    wire: torch.Tensor,
    codec: str | Codec,
    n: int,
    dtype: torch.dtype,
    *,
    fp_wire: torch.dtype | None = None,
) -> torch.Tensor:
    """The first ``n`` values of the wire rows as ``dtype`` (flat), torch ops; same values as ``decode_ref``."""
    c = get_codec(codec)
    check_dtype(dtype)
    if c.kind == "fp":
        wd = fp_wire or fp_wire_dtype(dtype)
        vals = wire.reshape(-1, c.wire_row_bytes(wd)).contiguous().view(wd).reshape(-1)[:n]
        return vals.to(dtype)
    rows = wire.reshape(-1, c.row_bytes)
    r = rows.shape[0]
    codes = unpack_rows(rows[:, : c.code_bytes], c.bits, ROW).reshape(-1, BLOCK)
    scale = extscale.scale_values(rows[:, c.code_bytes :].contiguous().view(torch.float16).reshape(-1, 1))[0]
    if c.kind == "int":
        vals = codes.float().sub_(c.bias).mul_(scale)
    else:
        vals = e2m1_decode(codes).mul_(scale)
    vals = vals.view(-1)
    if n < r * ROW:
        vals = vals[:n]
    if dtype == torch.float16:
        vals = saturate_f16(vals)
    return vals if dtype == torch.float32 else vals.to(dtype)


F16_MAX, F16_OVERSHOOT = 65504.0, 65536.0


def saturate_f16(vals: torch.Tensor) -> torch.Tensor:
    """Quantized values bound for float16: |v| in (65504, 65536) becomes ±65504. A block of finite
    fp16 input decodes within one fp16 step above 65504 (FP4: 6·fp16(65504/6) = 65520, which
    float16 would round to inf); the all-reduce's overflowing sums are far beyond (2^17)."""
    return torch.where(vals.abs() < F16_OVERSHOOT, vals.clamp(-F16_MAX, F16_MAX), vals)


def _native_ok(t: torch.Tensor, c: Codec) -> bool:
    return t.device.type == "cpu" and native.available()


def wire_rows(wire: torch.Tensor, row_bytes: int, what: str) -> int:
    """The rows of a wire tensor: uint8 bytes, whole rows, else a ValueError naming ``what``."""
    if not isinstance(wire, torch.Tensor) or wire.dtype != torch.uint8:
        raise ValueError(f"{what}: the wire must be a uint8 tensor, got {getattr(wire, 'dtype', type(wire))}")
    if wire.numel() % row_bytes:
        raise ValueError(f"{what}: {wire.numel()} wire bytes are not whole rows of {row_bytes} bytes")
    return wire.numel() // row_bytes


def _check_out(out: torch.Tensor | None, shape: tuple[int, int], what: str) -> None:
    if out is not None and (tuple(out.shape) != shape or out.dtype != torch.uint8):
        raise ValueError(f"{what}: out has shape {tuple(out.shape)} ({out.dtype}), the wire needs {shape} (uint8)")


def encode(
    x: torch.Tensor, codec: str | Codec, *, fp_wire: torch.dtype | None = None, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Wire bytes ``[rows, row_bytes]`` of ``x`` (any shape, flattened), on x's device.

    ``out``: a contiguous uint8 ``[rows, row_bytes]`` buffer to fill (saves a copy in the all-reduce).
    """
    c = get_codec(codec)
    check_dtype(x.dtype)
    wd = fp_wire or fp_wire_dtype(x.dtype)
    rb = c.wire_row_bytes(wd)
    _check_out(out, (n_rows(x.numel()), rb), "encode")
    if not _native_ok(x, c) or (out is not None and not out.is_contiguous()):
        w = encode_torch(x, c, fp_wire=fp_wire)
        return w if out is None else out.copy_(w)
    flat = x.reshape(-1).contiguous()
    return native.encode_rows(flat, _kind(c, wd), c.bits, n_rows(flat.numel()), rb, c.wire_code_bytes(wd), out)


def _kind(c: Codec, fp_wire: torch.dtype | None = None) -> int:
    """The C kernel's codec id; the FP codec's depends on its wire dtype (bf16 2, fp16 3, fp32 4)."""
    if c.kind == "fp":
        return {torch.float16: 3, torch.float32: 4}.get(fp_wire, 2)
    return 0 if c.kind == "int" else 1


def decode(
    wire: torch.Tensor,
    codec: str | Codec,
    n: int,
    dtype: torch.dtype,
    *,
    fp_wire: torch.dtype | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The first ``n`` values of the wire rows as ``dtype`` (flat); written into ``out`` if given.
    ValueError when the wire is not whole uint8 rows or holds fewer than ``n`` values."""
    c = get_codec(codec)
    check_dtype(dtype)
    wd = fp_wire or fp_wire_dtype(dtype)
    rb = c.wire_row_bytes(wd)
    r = wire_rows(wire, rb, "decode")
    if not 0 <= n <= r * ROW:
        raise ValueError(f"decode: n = {n} values, the wire holds {r} rows = {r * ROW} values")
    if out is not None and out.numel() != n:
        raise ValueError(f"decode: out holds {out.numel()} values, n = {n}")
    if not _native_ok(wire, c) or (out is not None and not out.is_contiguous()):
        vals = decode_torch(wire, c, n, dtype, fp_wire=fp_wire)
        return vals if out is None else out.copy_(vals)
    rows = wire.reshape(-1, rb).contiguous()
    return native.decode_rows(rows, _kind(c, wd), c.bits, rb, c.wire_code_bytes(wd), n, dtype, out)


def decode_add(acc: torch.Tensor, wire: torch.Tensor, codec: str | Codec, *, fp_wire: torch.dtype) -> None:
    """``acc += decode(wire)`` for a flat fp32 ``acc`` (fused on CPU); same bits as the unfused sum."""
    c = get_codec(codec)
    rb = c.wire_row_bytes(fp_wire)
    if wire_rows(wire, rb, "decode_add") * ROW < acc.numel():
        raise ValueError(f"decode_add: acc has {acc.numel()} values, the wire holds {wire.numel() // rb * ROW}")
    if _native_ok(wire, c) and acc.is_contiguous() and acc.dtype == torch.float32:
        rows = wire.reshape(-1, rb).contiguous()
        native.decode_rows(rows, _kind(c, fp_wire), c.bits, rb, c.wire_code_bytes(fp_wire), acc.numel(), out=acc,
                           accumulate=True)
    else:
        acc += decode(wire, c, acc.numel(), torch.float32, fp_wire=fp_wire)


def reduce_encode(wires: list[torch.Tensor], codec: str | Codec, *, fp_wire: torch.dtype, clamp: float = 0.0,
                  out: torch.Tensor | None = None, fused: bool = True) -> torch.Tensor:
    """encode(fp16_sums(decode(wires[0]) + decode(wires[1]) + ...)) with fp32 sums in list order: the
    middle step of the two-shot all-reduce. On CPU one fused C pass per row (the fp32 sum stays
    in cache); elsewhere, or with ``fused=False``, the unfused steps. Same bytes either way (tested).
    ``clamp`` > 0: float16 input: every contribution saturated as :func:`saturate_f16` (an fp16
    value is within ±65504; FP4 may decode it up to 65520), the sums bounded as :func:`fp16_sums`."""
    c = get_codec(codec)
    rb = c.wire_row_bytes(fp_wire)
    if not wires:
        raise ValueError("reduce_encode: needs at least one wire")
    counts = [wire_rows(w, rb, f"reduce_encode wire {j}") for j, w in enumerate(wires)]
    rows = counts[0]
    if any(k != rows for k in counts):
        raise ValueError(f"reduce_encode: the wires have different row counts {counts}")
    _check_out(out, (rows, rb), "reduce_encode")
    if fused and all(_native_ok(w, c) and w.is_contiguous() for w in wires) and (out is None or out.is_contiguous()):
        if out is None:
            out = torch.empty(rows, rb, dtype=torch.uint8)
        return native.reduce_rows([w.reshape(-1, rb) for w in wires], _kind(c, fp_wire), c.bits, rb,
                                  c.wire_code_bytes(fp_wire), clamp, out)
    n = rows * ROW
    if clamp > 0:  # float16 input: each contribution saturated to its range, then the sums bounded
        acc = saturate_f16(decode(wires[0], c, n, torch.float32, fp_wire=fp_wire))
        for w in wires[1:]:
            acc += saturate_f16(decode(w, c, n, torch.float32, fp_wire=fp_wire))
        acc = fp16_sums(acc, clamp)
    else:
        acc = decode(wires[0], c, n, torch.float32, fp_wire=fp_wire)
        for w in wires[1:]:
            decode_add(acc, w, c, fp_wire=fp_wire)
    return encode(acc, c, fp_wire=fp_wire, out=out)


F16_OVERFLOW = 65520.0  # the smallest magnitude float16 rounds to inf


def fp16_sums(acc: torch.Tensor, clamp: float) -> torch.Tensor:
    """float32 sums bound for float16, before re-encoding: an overflowing one (|sum| ≥ 65520, inf
    in float16) becomes ±clamp, which every codec decodes beyond 65536 (so inf, as dist.all_reduce);
    one in (65504, 65520) becomes ±65504, what float16 rounds it to (so the codec cannot push it
    over). NaN stays NaN."""
    over = torch.full_like(acc, clamp).copysign_(acc)
    return torch.where(acc.abs() >= F16_OVERFLOW, over, acc.clamp(-F16_MAX, F16_MAX))
