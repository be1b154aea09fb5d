"""Wire codecs: exact bytes per row, fast == reference bit for bit, error bound, NaN/Inf policy."""

import os
import shutil

import pytest
import torch

from lowbit.comm.accuracy import quantization_bound
from lowbit.comm.codecs import (
    CODECS, ROW, decode, decode_add, decode_ref, decode_torch, encode, encode_ref, encode_torch, get_codec, native,
)
from lowbit.comm.codecs.bitpack import pack_rows, unpack_rows
from lowbit.formats import pack

ROW_BYTES = {"fp": 4096, "int8": 2176, "int6": 1664, "int4": 1152, "int3": 896, "fp4": 1152}
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _row_bytes(name: str, dtype: torch.dtype) -> int:
    """Exact wire bytes per 2048-value row: the FP codec sends the raw dtype (fp32: 8192)."""
    return 8192 if (name == "fp" and dtype == torch.float32) else ROW_BYTES[name]


def _bits(t: torch.Tensor) -> torch.Tensor:
    """Bit patterns, with every NaN made canonical (NaN payloads differ between torch's own
    scalar and vectorised casts, so they carry no meaning)."""
    t = torch.where(torch.isnan(t), torch.full_like(t, float("nan")), t)
    return t.view(torch.int32 if t.element_size() == 4 else torch.int16)


def _nasty(n: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * torch.exp(torch.randn(n, generator=g) * 2)
    x[64:96] = 0.0  # an all-zero block
    x[96:128] = torch.tensor([1.0, -1.0] * 16)  # signed-absmax tie
    x[128:160] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0] * 4) * 2  # E2M1 ties
    x[200] = float("nan")
    x[700] = float("inf")
    x[900] = -float("inf")
    if dtype != torch.float16:
        x[1500] = 3e6  # beyond the fp16 scale range of INT6/4/3 and FP4: an extended scale
    return x.to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(CODECS))
def test_bytes_per_row_exact(name, dtype):
    c = get_codec(name)
    assert c.row_bytes == ROW_BYTES[name]  # 16-bit input
    assert c.wire_row_bytes(dtype) == _row_bytes(name, dtype)
    assert c.ratio(dtype) == pytest.approx(ROW * (4 if dtype == torch.float32 else 2) / _row_bytes(name, dtype))
    for n, rows in [(ROW, 1), (1, 1), (ROW + 1, 2), (5 * ROW, 5)]:
        for enc in (encode, encode_torch, encode_ref):
            w = enc(torch.randn(n).to(dtype), c)
            assert w.dtype == torch.uint8 and tuple(w.shape) == (rows, _row_bytes(name, dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_fp_codec_sends_the_raw_input(dtype):
    """The FP wire is the input's own bytes (zero padded), so decoding gives the input back exactly."""
    x = _nasty(ROW + 300, dtype)
    w = encode(x, "fp")
    assert torch.equal(w.reshape(-1)[: x.numel() * x.element_size()], x.view(torch.uint8))
    assert not bool(w.reshape(-1)[x.numel() * x.element_size():].any())
    for dec in (decode, decode_torch, decode_ref):
        assert torch.equal(_bits(dec(w, "fp", x.numel(), dtype)), _bits(x))


@pytest.mark.parametrize("wire", DTYPES)
def test_fp_codec_other_wire_dtypes_on_fp32(wire):
    """An explicit ``fp_wire`` still works: every implementation writes and reads the same bytes."""
    x = _nasty(ROW + 5, torch.float32)
    w_ref = encode_ref(x, "fp", fp_wire=wire)
    assert w_ref.shape[1] == ROW * wire.itemsize
    for enc, dec in IMPLS:
        assert torch.equal(enc(x, "fp", fp_wire=wire), w_ref)
        for out in DTYPES:
            a = dec(w_ref, "fp", x.numel(), out, fp_wire=wire)
            assert torch.equal(_bits(a), _bits(decode_ref(w_ref, "fp", x.numel(), out, fp_wire=wire)))
    acc = torch.ones(x.numel())
    decode_add(acc, w_ref, "fp", fp_wire=wire)
    assert torch.equal(_bits(acc), _bits(1 + decode_ref(w_ref, "fp", x.numel(), torch.float32, fp_wire=wire)))


def test_encode_out_buffer_of_the_wrong_shape_is_an_error():
    if not native.available():
        pytest.skip("no C compiler")
    with pytest.raises(ValueError, match="out has shape"):
        encode(torch.randn(ROW), "fp", out=torch.empty(1, 4096, dtype=torch.uint8))  # fp32 rows are 8192 B


IMPLS = [(encode_torch, decode_torch)] + ([(encode, decode)] if native.available() else [])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(CODECS))
def test_fast_equals_reference_bit_for_bit(name, dtype):
    """Both fast paths (torch-vectorised; compiled C on CPU) give the reference's exact bytes and values."""
    if os.environ.get("LOWBIT_QR_NATIVE", "1") != "0":
        assert native.available() or not shutil.which("cc"), "the C codec should build where cc exists"
    x = _nasty(2 * ROW + 777, dtype)
    w_ref = encode_ref(x, name)
    wire = dtype  # the FP codec's wire is the input dtype
    fp_wire = wire if name == "fp" else None
    for enc, dec in IMPLS:
        w = enc(x, name)
        assert torch.equal(w, w_ref)
        for out in DTYPES:
            a = dec(w, name, x.numel(), out, fp_wire=fp_wire)
            b = decode_ref(w_ref, name, x.numel(), out, fp_wire=fp_wire)
            assert torch.equal(_bits(a), _bits(b))
    acc = torch.ones(x.numel())
    decode_add(acc, w_ref, name, fp_wire=wire)
    assert torch.equal(_bits(acc), _bits(torch.ones(x.numel()) + decode_ref(w_ref, name, x.numel(), torch.float32, fp_wire=wire)))


@pytest.mark.parametrize("bits", [8, 6, 4, 3])
def test_fast_packing_matches_formats(bits):
    codes = torch.randint(0, 2**bits, (3, ROW), dtype=torch.uint8)
    ref = pack(codes, bits)
    out = torch.empty_like(ref)
    pack_rows(codes, bits, out)
    assert torch.equal(out, ref)
    assert torch.equal(unpack_rows(out, bits, ROW), codes)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(CODECS))
def test_round_trip_within_bound(name, dtype):
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(3 * ROW + 5, generator=g) * 10).to(dtype)
    out = x.dtype if name == "fp" else torch.float32  # the FP wire depends on the dtype
    y = decode(encode(x, name), name, x.numel(), out)
    err = (y.double() - x.double()).abs()
    assert bool((err <= quantization_bound(x, name)).all())


@pytest.mark.parametrize("name", [n for n in CODECS if n != "fp"])
def test_nonfinite_poisons_only_its_block(name):
    x = torch.randn(ROW, dtype=torch.float32)
    clean = decode(encode(x, name), name, ROW, torch.float32)
    x[40] = float("nan")
    x[100] = float("inf")
    y = decode(encode(x, name), name, ROW, torch.float32)
    bad = torch.zeros(ROW, dtype=torch.bool)
    bad[32:64] = True
    bad[96:128] = True
    assert bool(torch.isnan(y[bad]).all())
    assert torch.equal(y[~bad], clean[~bad])


def test_fp_codec_is_elementwise_for_nonfinite():
    x = torch.randn(100, dtype=torch.bfloat16)
    x[3] = float("nan")
    y = decode(encode(x, "fp"), "fp", 100, torch.bfloat16)
    assert torch.isnan(y[3]) and torch.equal(torch.cat([y[:3], y[4:]]), torch.cat([x[:3], x[4:]]))


def test_zero_block_decodes_to_exact_zeros_and_empty_input():
    for name in CODECS:
        assert torch.equal(decode(encode(torch.zeros(50), name), name, 50, torch.float32), torch.zeros(50))
        w = encode(torch.zeros(0), name)
        assert w.shape[0] == 0 and decode(w, name, 0, torch.float32).numel() == 0


def test_bad_codec_and_dtype():
    with pytest.raises(ValueError, match="unknown codec"):
        get_codec("int5")
    with pytest.raises(TypeError, match="float16, bfloat16 or float32"):
        encode(torch.ones(4, dtype=torch.int32), "int4")


@pytest.mark.parametrize("dtype", DTYPES)
def test_simd_and_portable_builds_write_the_same_bits(dtype):
    """The -march=native build (AVX2/F16C intrinsics where the CPU has them) and the portable C
    loops (-O3, no intrinsics) give the same bytes and values, so CI machines may differ."""
    if not native.available():
        pytest.skip("no C compiler")
    port = native.variant(native.PORTABLE_FLAGS)
    assert port is not None, "the portable build must compile wherever the native one does"
    from lowbit.comm.codecs.fast import _kind

    x = _nasty(3 * ROW + 777, dtype, seed=5)
    x[3000:3040] = torch.tensor([-0.0, 0.0] * 20).to(dtype)  # zero and negative-zero block
    x[3072:3104] = torch.tensor([-2.0, 2.0] * 16).to(dtype)  # signed-absmax tie, negative first
    x[3168:3200] = torch.tensor([0.5] * 9 + [3.0] + [1.0] * 11 + [-3.0] + [0.25] * 10).to(dtype)  # tie, positive first
    x[3104:3136] = torch.tensor([65504.0 * 4] + [1.0] * 31).to(dtype) if dtype != torch.float16 else x[3104:3136]
    rows = -(-x.numel() // ROW)
    for name in CODECS:
        c = get_codec(name)
        rb, cb, k = c.wire_row_bytes(dtype), c.wire_code_bytes(dtype), _kind(c, dtype)
        a = native.encode_rows(x, k, c.bits, rows, rb, cb)
        b = native.encode_rows(x, k, c.bits, rows, rb, cb, lib=port)
        assert torch.equal(a, b), name
        for out in DTYPES:
            va = native.decode_rows(a, k, c.bits, rb, cb, x.numel() - 3, out)
            vb = native.decode_rows(a, k, c.bits, rb, cb, x.numel() - 3, out, lib=port)
            assert torch.equal(_bits(va), _bits(vb)), (name, out)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(CODECS))
def test_fused_reduce_equals_decode_add_encode(name, dtype):
    """The all-reduce's middle step fused in C (per row, sum in cache) writes the unfused bytes."""
    from lowbit.comm.codecs import fp_wire_dtype, reduce_encode

    wd = fp_wire_dtype(dtype)
    xs = [_nasty(2 * ROW, dtype, seed=s) * (1 + s) for s in range(3)]
    if dtype == torch.float16:
        xs[0][5], xs[1][5] = 60000.0, 60000.0  # the fp16 sum overflows: clamped, then decoded as inf
    wires = [encode(x, name) for x in xs]
    clamp = 2.0**17 if (dtype == torch.float16 and name != "fp") else 0.0
    want = reduce_encode(wires, name, fp_wire=wd, clamp=clamp, fused=False)
    assert torch.equal(reduce_encode(wires, name, fp_wire=wd, clamp=clamp), want)
    if native.available():
        port = native.variant(native.PORTABLE_FLAGS)
        c = get_codec(name)
        from lowbit.comm.codecs.fast import _kind

        got = native.reduce_rows(wires, _kind(c, wd), c.bits, c.wire_row_bytes(wd), c.wire_code_bytes(wd), clamp,
                                 torch.empty_like(want), lib=port)
        assert torch.equal(got, want)


def test_divide_switch_reads_its_variable(monkeypatch):
    """LOWBIT_QR_DIVIDE chooses how the AVX-512 integer codes are computed (the same bits: the ISA
    tests encode both ways); anything but 0/1 is an error, not a silent default."""
    from lowbit.comm.codecs import native

    monkeypatch.setenv("LOWBIT_QR_DIVIDE", "1")
    assert native.divide_codes() is True
    monkeypatch.setenv("LOWBIT_QR_DIVIDE", "0")
    assert native.divide_codes() is False
    monkeypatch.setenv("LOWBIT_QR_DIVIDE", "yes")
    with pytest.raises(ValueError, match="LOWBIT_QR_DIVIDE"):
        native.divide_codes()
