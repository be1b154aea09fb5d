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
        x[1500] = 3e6  # beyond the fp16 scale range of every integer codec: the block is poisoned
    return x.to(dtype)


@pytest.mark.parametrize("name", list(CODECS))
def test_bytes_per_row_exact(name):
    c = get_codec(name)
    assert c.row_bytes == ROW_BYTES[name]
    for n, rows in [(ROW, 1), (1, 1), (ROW + 1, 2), (5 * ROW, 5)]:
        w = encode(torch.randn(n, dtype=torch.bfloat16), c)
        assert w.dtype == torch.uint8 and tuple(w.shape) == (rows, ROW_BYTES[name])


IMPLS = [(encode_torch, decode_torch)] + ([(encode, decode)] if native.available() else [])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(CODECS))
def test_fast_equals_reference_bit_for_bit(name, dtype):
    """Both fast paths (torch-vectorised; compiled C on CPU) give the reference's exact bytes and values."""
    if os.environ.get("LOWBIT_QR_NATIVE", "1") != "0":
        assert native.available() or not shutil.which("cc"), "the C codec should build where cc exists"
    x = _nasty(2 * ROW + 777, dtype)
    w_ref = encode_ref(x, name)
    wire = torch.bfloat16 if dtype != torch.float16 else torch.float16
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
