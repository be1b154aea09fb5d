"""lowbit's native W8A16 kernel against the float64 reference.

Its only roundings are the int16 activation step per block b of 256 channels (|Δx| ≤ s_b/2,
s_b = absmax_b/32767, so |Δy| ≤ Σ_b s_b/2·Σ_{k∈b}|w_k|) and float32 rescaling and sums
(≤ 2^-20·Σ|x||w| here: a few float32 operations, each 2^-24 relative).
"""

import pytest
import torch

from lowbit.kernels.cpu import a16_gemm, w8_gemv, w8a16
from lowbit.kernels import from_float
from lowbit.kernels.linear_params import LinearParams
from tests.threads import assert_same_for_thread_counts

pytestmark = pytest.mark.skipif(not w8_gemv.available(), reason="no C compiler for the native kernel")
BLOCK = 256


def _bound(x: torch.Tensor, p: LinearParams) -> torch.Tensor:
    w = p.dequantize().double().abs()
    xa, n = x.double().abs(), x.shape[1]
    s = torch.stack([xa[:, a:a + BLOCK].amax(1) / 32767 for a in range(0, n, BLOCK)], 1)
    wsum = torch.stack([w[:, a:a + BLOCK].sum(1) for a in range(0, n, BLOCK)], 1)
    return s / 2 @ wsum.t() + 2.0 ** -20 * (xa @ w.t()) + 1e-12


@pytest.mark.parametrize("method", ["native", "gemm"])
@pytest.mark.parametrize("t,out,n", [(1, 4096, 4096), (3, 1536, 576), (5, 37, 200), (9, 64, 1000), (0, 8, 64)])
def test_native_within_int16_bound(t, out, n, method):
    torch.manual_seed(t + out + n)
    p = from_float(torch.randn(out, n) / n ** 0.5, "w8a16", bias=torch.randn(out))
    x = torch.randn(t, n) * 3
    st = w8a16.prepare(p, method)
    assert st.method == method
    y = w8a16.run(x, st)
    ref = x.double() @ p.dequantize().double().t() + p.bias.double()
    assert y.shape == (t, out) and y.dtype == torch.float32
    assert torch.all((y.double() - ref).abs() <= _bound(x, p))


def test_extreme_values_do_not_overflow():
    """Weights ±127 against activations at ±absmax across a whole 256-channel block: the
    largest int32 block sums (256·127·32767 < 2^31)."""
    codes = torch.full((8, 1024), 127, dtype=torch.int8)
    codes[4:] = -127
    p = LinearParams("w8a16", codes, torch.ones(8, 1), None, 0, torch.zeros(8, 0, dtype=torch.int8), torch.ones(8), None)
    x = torch.full((1, 1024), -3.5)
    for method in ("native", "gemm"):  # the batched kernel's Σ(c + 128)·x wraps; the product it returns must not
        y = w8a16.run(x, w8a16.prepare(p, method))
        assert torch.equal(y[0], torch.tensor([-1024 * 127 * 3.5] * 4 + [1024 * 127 * 3.5] * 4)), method


def test_portable_build_batches_threads_and_bf16_agree():
    p = from_float(torch.randn(70, 600), "w8a16")
    st = w8a16.prepare(p, "native")
    x = torch.randn(7, 600) * torch.linspace(0.01, 10, 600)
    y = w8_gemv.run(x, st)
    lib = w8_gemv.library(w8_gemv.PORTABLE_FLAGS)
    if lib is not None and w8_gemv.library().w8_has_simd():  # else both would be the portable loop
        assert torch.equal(w8_gemv.run(x, st, lib), y)
        xb = x.bfloat16()
        assert torch.equal(w8_gemv.run(xb, st, lib), w8_gemv.run(xb, st))
    for i in range(7):  # alone (4 rows per load) or in a group of 4 tokens (one sign extension)
        assert torch.equal(w8_gemv.run(x[i:i + 1], st)[0], y[i])
    assert_same_for_thread_counts(lambda: w8_gemv.run(x, st), y)


def test_bfloat16_in_and_out_and_nonfinite_tokens():
    p = from_float(torch.randn(40, 576), "w8a16")
    st = w8a16.prepare(p, "native")
    x = (torch.randn(3, 576) * 4).bfloat16()
    y = w8_gemv.run(x, st)
    assert y.dtype == torch.bfloat16
    assert torch.equal(y, w8_gemv.run(x.float(), st).bfloat16())
    for bad in (float("nan"), float("-inf")):
        xb = x.clone()
        xb[1, 300] = bad
        yb = w8_gemv.run(xb, st)
        assert torch.isnan(yb[1]).all() and torch.equal(yb[0], y[0]) and torch.equal(yb[2], y[2])


def test_method_choice():
    p = from_float(torch.randn(16, 256), "w8a16")
    assert w8a16.prepare(p).method == w8a16.default_method() == ("gemm" if a16_gemm.simd() >= 512 else "native")
    assert w8a16.prepare(p, "int8pack").method == "int8pack"
