"""Bounded fuzzing of the native entry points (codec C library, w8/w4 kernel wrappers): random
shapes, lengths, dtypes and extreme values either raise a clear ValueError or give the torch
reference's result, never a crash or bytes from outside the buffers."""

import ctypes

import pytest
import torch
from hypothesis import given, settings, strategies as st

from lowbit.comm.codecs import CODECS, ROW, decode, decode_torch, encode, encode_torch, get_codec, native, reduce_encode
from lowbit.comm.codecs.fast import _kind
from lowbit.kernels.cpu import w4_gemv, w8_gemv
from lowbit.kernels import from_float

pytestmark = pytest.mark.skipif(not native.available(), reason="no C compiler")

SPECIALS = [0.0, -0.0, 1e-40, 65504.0, 65520.0, 393120.0, 524032.0, 1e6, 3e38, -3.4028234663852886e38,
            float("nan"), float("inf"), -float("inf")]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
FUZZ = settings(max_examples=100, deadline=None)


def _bits(t: torch.Tensor) -> torch.Tensor:
    t = torch.where(torch.isnan(t), torch.full_like(t, float("nan")), t)
    return t.view(torch.int32 if t.element_size() == 4 else torch.int16)


@st.composite
def inputs(draw):
    n = draw(st.integers(0, 3 * ROW + 5))
    dtype = draw(st.sampled_from(DTYPES))
    x = torch.randn(n, generator=torch.Generator().manual_seed(draw(st.integers(0, 99)))) * draw(
        st.sampled_from([1e-3, 1.0, 1e4, 1e30]))
    for i, v in draw(st.lists(st.tuples(st.integers(0, max(n - 1, 0)), st.sampled_from(SPECIALS)), max_size=6)):
        if n:
            x[i] = v
    return x.to(dtype)


@FUZZ
@given(x=inputs(), codec=st.sampled_from(list(CODECS)), extra=st.integers(-ROW, 3 * ROW))
def test_encode_decode_match_torch_or_refuse(x, codec, extra):
    w = encode(x, codec)
    assert torch.equal(w, encode_torch(x, codec))
    fpw = x.dtype if codec == "fp" else None
    cap = w.shape[0] * ROW
    n = max(0, x.numel() + extra)
    for out in DTYPES:
        if n > cap:
            with pytest.raises(ValueError, match="the wire holds"):
                decode(w, codec, n, out, fp_wire=fpw)
            c = get_codec(codec)
            wd = fpw or out
            with pytest.raises(ValueError, match="the wire holds"):
                native.decode_rows(w, _kind(c, wd), c.bits, c.wire_row_bytes(wd), c.wire_code_bytes(wd), n, out)
        else:
            assert torch.equal(_bits(decode(w, codec, n, out, fp_wire=fpw)),
                               _bits(decode_torch(w, codec, n, out, fp_wire=fpw)))


@FUZZ
@given(codec=st.sampled_from(list(CODECS)), rows=st.lists(st.integers(0, 3), min_size=1, max_size=4),
       dtype=st.sampled_from(DTYPES), seed=st.integers(0, 99))
def test_reduce_encode_refuses_wires_of_different_rows(codec, rows, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    wires = [encode((torch.randn(r * ROW, generator=g) * 10).to(dtype), codec) for r in rows]
    clamp = 2.0**17 if dtype == torch.float16 and codec != "fp" else 0.0
    if len(set(rows)) > 1:
        for fused in (True, False):
            with pytest.raises(ValueError, match="different row counts"):
                reduce_encode(wires, codec, fp_wire=dtype, clamp=clamp, fused=fused)
    else:
        assert torch.equal(reduce_encode(wires, codec, fp_wire=dtype, clamp=clamp),
                           reduce_encode(wires, codec, fp_wire=dtype, clamp=clamp, fused=False))


def test_the_c_library_checks_sizes_itself():
    """Called past the Python checks, the C entry points refuse buffers too small for their rows."""
    lib = native.variant(native.PORTABLE_FLAGS)
    c = get_codec("int4")
    w = encode(torch.randn(ROW), c)
    out = torch.empty(2 * ROW)
    args = (w.data_ptr(), 2, 0, 4, c.row_bytes, c.code_bytes, out.data_ptr(), 2 * ROW, 0, 0)
    assert lib.qr_decode(*args, w.numel(), out.numel()) == -1  # 2 rows claimed, 1 in the wire
    assert lib.qr_decode(w.data_ptr(), 1, 0, 5, c.row_bytes, c.code_bytes, out.data_ptr(), ROW, 0, 0, w.numel(),
                         out.numel()) == -1  # 5 bits: not a layout of ours
    ptrs = (ctypes.c_void_p * 2)(w.data_ptr(), w.data_ptr())
    sizes = (ctypes.c_int64 * 2)(w.numel(), w.numel() // 2)
    res = torch.empty_like(w)
    assert lib.qr_reduce(ptrs, 2, 1, 0, 4, c.row_bytes, c.code_bytes, 0.0, res.data_ptr(), sizes, res.numel()) == -1
    assert lib.qr_encode(torch.randn(ROW).data_ptr(), 0, ROW, 2, 0, 4, res.data_ptr(), c.row_bytes, c.code_bytes,
                         res.numel()) == -1  # 2 rows into a 1-row buffer


@pytest.mark.skipif(not w8_gemv.available(), reason="no C compiler for the native kernel")
@FUZZ
@given(t=st.integers(0, 5), n=st.integers(1, 80), out=st.integers(1, 9), dn=st.integers(-3, 3), dt=st.integers(-1, 1),
       big=st.booleans())
def test_w8_codes_kernel_matches_integer_reference_or_refuses(t, n, out, dn, dt, big):
    g = torch.Generator().manual_seed(t * 1000 + n * 10 + out)
    wc = torch.randint(-128, 128, (out, n), generator=g, dtype=torch.int8)
    ws = torch.rand(out, generator=g) + 0.5
    w = w8_gemv.prepare(wc, ws)
    lim = 128 if big else 4
    codes = torch.randint(-lim, lim, (t, max(n + dn, 0)), generator=g).to(torch.int8)
    scale = torch.rand(max(t + dt, 0), generator=g) + 0.5
    if codes.shape[1] != n or scale.numel() != t:
        with pytest.raises(ValueError, match="w8 native kernel"):
            w8_gemv.run_codes(codes, scale, w)
        return
    y = w8_gemv.run_codes(codes, scale, w)
    dot = (codes.long() @ wc.long().T).float()  # exact: |dot| < 2^24 here
    assert torch.allclose(y, dot * (ws[None, :] * scale[:, None]), rtol=1e-6, atol=0)


@pytest.mark.parametrize("mod,kind", [(w4_gemv, "w4a16"), (w8_gemv, "w8a16")])
def test_a16_kernels_refuse_activations_of_another_width(mod, kind):
    if not mod.available():
        pytest.skip("no C compiler for the native kernel")
    p = from_float(torch.randn(8, 128), kind)
    if mod is w4_gemv:
        w = mod.prepare(p)
    else:
        w = mod.prepare(p.codes.to(torch.int8), p.scale.reshape(-1))
    for shape in [(2, 127), (2, 256), (3, 2, 64), (129,)]:
        with pytest.raises(ValueError, match=r"\[\.\.\., 128\]"):
            mod.run(torch.randn(*shape), w)
    assert mod.run(torch.randn(3, 128), w).shape == (3, 8)
