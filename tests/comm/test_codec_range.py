"""Finite input never decodes to NaN/Inf: blocks beyond the fp16 scale range take the extended
scale (every implementation the same bytes, within the stated bound), FP4's overshoot above
65504 saturates in float16 output, NaN/Inf input still poisons only its own block."""

import math

import pytest
import torch

from lowbit.comm.accuracy import quantization_bound
from lowbit.comm.codecs import CODECS, ROW, decode_ref, decode_torch, encode_ref, encode_torch, get_codec, native
from lowbit.comm.codecs import decode as decode_fast, encode as encode_fast
from lowbit.comm.codecs.extscale import BF16_MAX
from lowbit.comm.codecs.fast import _kind

F32_MAX = torch.finfo(torch.float32).max
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def threshold(name: str) -> float:
    """The largest block absmax whose scale still fits fp16 (float32 arithmetic)."""
    c = get_codec(name)
    return 65504.0 * -c.qmin if c.kind == "int" else 393120.0  # FP4: fp16(a / 6) < inf iff a / 6 < 65520


def _up(v: float) -> float:
    return float(torch.nextafter(torch.tensor(v), torch.tensor(math.inf)))


def _down(v: float) -> float:
    return float(torch.nextafter(torch.tensor(v), torch.tensor(0.0)))


def boundary_values(name: str, dtype: torch.dtype) -> list[float]:
    """Just below / at / above the scale overflow, and the float16, float32 and bfloat16 extremes."""
    if dtype == torch.float16:
        return [65504.0, -65504.0, 65503.0, 65472.0, 32768.0, 60000.0]
    t = threshold(name) if name != "fp" else 65504.0
    vals = [_down(t), t, _up(t), 65504.0, 65520.0, 1e6, -1e6, 3e6, 3e38, -3e38, BF16_MAX]
    if dtype == torch.float32:
        vals += [F32_MAX, -F32_MAX, _down(F32_MAX)]
    return vals


def boundary_input(name: str, dtype: torch.dtype) -> torch.Tensor:
    """One block per boundary value (that value, -value/3 and small ones), and two ordinary rows."""
    vals = boundary_values(name, dtype)
    g = torch.Generator().manual_seed(len(vals))
    x = torch.randn(2 * ROW + 32 * len(vals), generator=g) * 20
    x[::32] = 300.0  # one clear absmax per ordinary block (the reference breaks ±ties its own way)
    for i, v in enumerate(vals):
        blk = 2 * ROW + 32 * i
        x[blk + i % 32] = v
        x[blk + (i + 7) % 32] = -v / 3
    return x.to(dtype)


def _impls():
    out = [("torch", encode_torch, decode_torch)]
    if native.available():
        out.append(("native", encode_fast, decode_fast))
        port = native.variant(native.PORTABLE_FLAGS)

        def enc_port(x, name):
            c = get_codec(name)
            wd = x.dtype
            return native.encode_rows(x.reshape(-1).contiguous(), _kind(c, wd), c.bits, -(-x.numel() // ROW),
                                      c.wire_row_bytes(wd), c.wire_code_bytes(wd), lib=port)

        def dec_port(w, name, n, dtype, fp_wire=None):
            c = get_codec(name)
            wd = fp_wire or dtype
            return native.decode_rows(w, _kind(c, wd), c.bits, c.wire_row_bytes(wd), c.wire_code_bytes(wd), n, dtype,
                                      lib=port)

        out.append(("portable C", enc_port, dec_port))
    return out


IMPLS = _impls()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(CODECS))
def test_finite_input_decodes_finite_the_same_everywhere_within_bound(name, dtype):
    x = boundary_input(name, dtype)
    n = x.numel()
    fp_wire = dtype if name == "fp" else None
    w_ref = encode_ref(x, name)
    for label, enc, dec in IMPLS:
        w = enc(x, name)
        assert torch.equal(w, w_ref), label
        # every output dtype that holds the input (quantized codecs keep fp32 input within bf16 too)
        outs = [torch.float32] + ([torch.bfloat16] if dtype != torch.float32 or name != "fp" else [])
        outs += [torch.float16] if dtype == torch.float16 else []
        for out in outs:
            y = dec(w, name, n, out, fp_wire=fp_wire)
            assert torch.equal(y, decode_ref(w_ref, name, n, out, fp_wire=fp_wire)), (label, out)
            assert bool(torch.isfinite(y).all()), (label, out, x[~torch.isfinite(y)][:4])
        y = dec(w, name, n, torch.float32 if name != "fp" else dtype, fp_wire=fp_wire)
        err = (y.double() - x.double()).abs()
        assert bool((err <= quantization_bound(x, name)).all()), label


@pytest.mark.parametrize("name", [n for n in CODECS if n != "fp"])
def test_fp16_max_stays_finite_in_fp16(name):
    """fp16 65504 (FP4 decodes it as 65520, which float16 rounds to inf) comes back as 65504."""
    x = torch.full((64,), 65504.0, dtype=torch.float16)
    x[1::2] = -65504.0
    for label, enc, dec in IMPLS:
        w = enc(x, name)
        y = dec(w, name, 64, torch.float16)
        assert bool(torch.isfinite(y).all()), label
        y32 = dec(w, name, 64, torch.float32)  # the bound is stated for float32 output
        assert bool(((y32.double() - x.double()).abs() <= quantization_bound(x, name)).all()), label
        if name == "fp4":
            assert torch.equal(y, x), label


@pytest.mark.parametrize("name", [n for n in CODECS if n != "fp"])
def test_nonfinite_still_poisons_only_its_block_next_to_extended_ones(name):
    x = torch.randn(ROW) * 10
    x[5] = 3e38  # block 0: extended scale, finite
    x[40] = float("nan")  # block 1: poisoned
    x[70] = float("inf")  # block 2: poisoned
    for label, enc, dec in IMPLS:
        y = dec(enc(x, name), name, ROW, torch.float32)
        assert bool(torch.isfinite(y[:32]).all()) and bool(torch.isfinite(y[96:]).all()), label
        assert bool(torch.isnan(y[32:96]).all()), label


@pytest.mark.parametrize("name", [n for n in CODECS if n != "fp"])
def test_scale_bits_no_encoder_writes_poison_their_block_alike(name):
    """A peer's corrupt scale (fp16 ±inf, or the NaN space beyond the extended scales' range: k of
    15 or 128-142) decodes to NaN in its block only, the same bits in the reference, torch, the
    native and the portable build, float32 and bfloat16 out; it once decoded to ±inf, to zero,
    to tiny values of the wrong sign, or to different NaN bits per build."""
    c = get_codec(name)
    x = torch.randn(ROW) * 3
    for bits in (0x7C00, 0xFC00, 0x7C01, 0x7C03, 0x7DC4, 0x7DC8, 0xFDFF):
        label_bits = hex(bits)
        for label, enc, dec in IMPLS:
            w = enc(x, name).clone()
            w[0, c.code_bytes:c.code_bytes + 2] = torch.tensor([bits & 0xFF, bits >> 8], dtype=torch.uint8)
            for dtype in (torch.float32, torch.bfloat16):
                y = dec(w, name, ROW, dtype)
                ref = decode_ref(w, name, ROW, dtype)
                assert bool(torch.isnan(y[:32].float()).all()), (label_bits, label, dtype)
                assert torch.equal(y[32:], ref[32:]) and bool(torch.isfinite(y[32:].float()).all()), (label_bits, label)
                assert torch.equal(y.view(torch.int16 if dtype == torch.bfloat16 else torch.int32),
                                   IMPLS[0][2](w, name, ROW, dtype).view(torch.int16 if dtype == torch.bfloat16
                                                                         else torch.int32)), (label_bits, label, dtype)
