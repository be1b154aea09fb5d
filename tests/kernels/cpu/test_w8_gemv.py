"""lowbit's native W8A8 kernel: exact int32 products and the float method's rescale, so the same
bits as the float32-SGEMM and _int_mm methods for any batch, build and thread count."""

import pytest
import torch

from lowbit.kernels.cpu import w8_gemv, w8a8
from lowbit.kernels import from_float
from lowbit.kernels.linear_params import KernelError
from tests.threads import assert_same_for_thread_counts

pytestmark = pytest.mark.skipif(not w8_gemv.available(), reason="no C compiler for the native kernel")


@pytest.mark.parametrize("t,out,n", [(1, 4096, 4096), (5, 37, 200), (9, 576, 1536), (0, 8, 64), (4, 3, 33)])
def test_native_is_bit_identical_to_float_method(t, out, n):
    torch.manual_seed(t + out + n)
    p = from_float(torch.randn(out, n), "w8a8", bias=torch.randn(out))
    x = torch.randn(t, n) * 20
    y = w8a8.run(x, w8a8.prepare(p, "native"))
    assert y.shape == (t, out)
    assert torch.equal(y, w8a8.run(x, w8a8.prepare(p, "float")))


def test_portable_build_batches_and_threads_agree():
    p = from_float(torch.randn(70, 300), "w8a8")
    st = w8a8.prepare(p, "native")
    x = torch.randn(7, 300)
    a = w8a8.quantize_tokens(x, p.act)
    y = w8_gemv.run_codes(a.codes, a.scale, st.weight)
    lib = w8_gemv.library(w8_gemv.PORTABLE_FLAGS)
    if lib is not None:
        assert torch.equal(w8_gemv.run_codes(a.codes, a.scale, st.weight, lib), y)
    for i in range(7):  # alone (4 rows per load) or in a group of 4 tokens (one sign extension)
        assert torch.equal(w8_gemv.run_codes(a.codes[i:i + 1], a.scale[i:i + 1], st.weight)[0], y[i])
    assert_same_for_thread_counts(lambda: w8_gemv.run_codes(a.codes, a.scale, st.weight), y)


def test_extreme_codes_do_not_overflow():
    """All weights -128 (or 127) against all activations -128: the largest int32 sums."""
    codes = torch.full((8, 4096), -128, dtype=torch.int8)
    codes[4:] = 127
    st = w8_gemv.prepare(codes, torch.ones(8))
    x = torch.full((1, 4096), -128, dtype=torch.int8)
    y = w8_gemv.run_codes(x, torch.ones(1), st)
    expect = torch.tensor([4096 * 128 * 128] * 4 + [-4096 * 127 * 128] * 4, dtype=torch.float32)
    assert torch.equal(y[0], expect)


def test_codes_that_a_cast_or_the_row_sum_would_wrap_are_refused():
    """run_codes cast any codes to int16 (int32 40000 wrapped, float 0.7 became 0); the one int32 sum
    per row wraps past MAX_CODES_IN inputs of INT8 codes (from 1024 with the int16 codes once
    documented): refused, and exact at the largest width allowed."""
    st = w8_gemv.prepare(torch.full((4, 64), 127, dtype=torch.int8), torch.ones(4))
    for codes in (torch.full((1, 64), 40000, dtype=torch.int32), torch.full((1, 64), 0.7),
                  torch.ones(1, 64, dtype=torch.uint8)):
        with pytest.raises(ValueError, match="int8"):
            w8_gemv.run_codes(codes, torch.ones(1), st)
    n = w8_gemv.MAX_CODES_IN // 32 * 32
    wide = w8_gemv.prepare(torch.full((4, n + 32), -128, dtype=torch.int8), torch.ones(4))
    codes = torch.full((1, n + 32), -128, dtype=torch.int16)
    with pytest.raises(KernelError, match="overflow"):
        w8_gemv.run_int16_codes(codes, torch.ones(1), wide)
    with pytest.raises(KernelError, match="overflow"):
        w8_gemv.run_codes(codes.to(torch.int8), torch.ones(1), wide)
    with pytest.raises(KernelError, match="overflow"):
        w8_gemv.quantize_and_run(torch.randn(1, n + 32), wide, 8, 1.0)
    widest = w8_gemv.prepare(torch.full((4, n), -128, dtype=torch.int8), torch.ones(4))
    y = w8_gemv.run_int16_codes(codes[:, :n], torch.ones(1), widest)
    assert torch.equal(y, torch.full((1, 4), float(n * 128 * 128)))
