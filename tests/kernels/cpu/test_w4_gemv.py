"""lowbit's native W4A16 kernel against the float64 reference.

Its only roundings are the int16 activation step (|Δx| ≤ s_g/2 with s_g = absmax_g/32767 per
weight group g, so |Δy| ≤ Σ_g s_g/2·Σ_{k∈g}|w_k|) and float32 rescaling and sums (≤ 2^-20·Σ|x||w|
for these sizes: a few dozen float32 additions, each 2^-24 relative).
"""

import pytest
import torch

from lowbit.kernels.cpu import a16_gemm, w4_gemv, w4a16
from lowbit.kernels import from_float
from lowbit.kernels.linear_params import KernelError, LinearParams
from tests.threads import assert_same_for_thread_counts

pytestmark = pytest.mark.skipif(not w4_gemv.available(), reason="no C compiler for the native kernel")


def _bound(x: torch.Tensor, p: LinearParams) -> torch.Tensor:
    w = p.dequantize().double().abs()
    n, g = x.shape[1], p.group or x.shape[1]
    xa = x.double().abs()
    s = torch.stack([xa[:, a:a + g].amax(1) / 32767 for a in range(0, n, g)], 1)  # [t, groups]
    wsum = torch.stack([w[:, a:a + g].sum(1) for a in range(0, n, g)], 1)  # [out, groups]
    return s / 2 @ wsum.t() + 2.0 ** -20 * (xa @ w.t()) + 1e-12


def _asymmetric(out: int, n: int, group: int, seed: int = 0) -> LinearParams:
    g = torch.Generator().manual_seed(seed)
    ng = -(-n // group)
    return LinearParams("w4a16", torch.randint(0, 16, (out, n), generator=g, dtype=torch.uint8),
                        torch.rand(out, ng, generator=g) * 0.1 + 0.01, torch.randint(0, 16, (out, ng), generator=g),
                        group, torch.zeros(out, 0, dtype=torch.int8), torch.ones(out), None)


CASES = [(1, 4096, 4096, 128), (3, 1536, 576, 128), (5, 37, 200, 64), (2, 6, 576, 576), (0, 8, 128, 128),
         (9, 130, 1024, 256)]


@pytest.mark.parametrize("t,out,n,group", CASES)
def test_native_within_int16_bound(t, out, n, group):
    torch.manual_seed(out + n)
    x = torch.randn(t, n) * 3
    p = from_float(torch.randn(out, n) / n ** 0.5, "w4a16", group=group, bias=torch.randn(out))
    y = w4a16.run(x, w4a16.prepare(p, "native"))
    ref = x.double() @ p.dequantize().double().t() + p.bias.double()
    assert y.shape == (t, out) and y.dtype == torch.float32
    assert torch.all((y.double() - ref).abs() <= _bound(x, p))


def test_asymmetric_codes_with_zero_points():
    x = torch.randn(4, 320) * torch.linspace(0.1, 10, 320)  # channels of very different scale
    p = _asymmetric(44, 320, 64)
    y = w4_gemv.run(x, w4_gemv.prepare(p))
    ref = x.double() @ p.dequantize().double().t()
    assert torch.all((y.double() - ref).abs() <= _bound(x, p))


def test_portable_build_and_thread_counts_agree_bit_for_bit():
    lib = w4_gemv.library(w4_gemv.PORTABLE_FLAGS)
    if lib is None:
        pytest.skip("portable build failed")
    x = torch.randn(3, 1024)
    p = _asymmetric(260, 1024, 128, seed=1)
    st = w4_gemv.prepare(p)
    y = w4_gemv.run(x, st)
    ref = x.double() @ p.dequantize().double().t()
    yp = w4_gemv.run(x, st, lib)
    assert torch.all((yp.double() - ref).abs() <= _bound(x, p))
    assert torch.equal(y, yp)  # exact integer group sums, then the same float32 steps
    # rows are split between threads, never a row's sum: the same bits for any count
    assert_same_for_thread_counts(lambda: w4_gemv.run(x, st), y)


def test_batch_invariant_bit_for_bit():
    """Tokens run 4 at a time (one unpack each) or alone (4 rows per load): same bits either way."""
    p = _asymmetric(72, 576, 128, seed=2)
    st = w4_gemv.prepare(p)
    x = torch.randn(11, 576)
    y = w4_gemv.run(x, st)
    for i in range(11):
        assert torch.equal(w4_gemv.run(x[i:i + 1], st)[0], y[i])
    assert torch.equal(w4_gemv.run(x[3:9], st), y[3:9])


def test_pack_layout_is_what_the_kernel_reads():
    """A weight with one nonzero code per row lands on exactly the right input channel."""
    out, n = 8, 128
    codes = torch.full((out, n), 8, dtype=torch.int8) - 8  # symmetric code 0 everywhere
    for r in range(out):
        codes[r, (r * 37) % n] = 1
    p = LinearParams("w4a16", codes, torch.ones(out, 1), None, 0, torch.zeros(out, 0, dtype=torch.int8),
                     torch.ones(out), None)
    x = torch.arange(1, n + 1, dtype=torch.float32)[None] / n
    y = w4_gemv.run(x, w4_gemv.prepare(p))
    expect = torch.tensor([((r * 37) % n + 1) / n for r in range(out)])
    assert torch.allclose(y[0], expect, atol=1e-4)


def test_nonfinite_activation_poisons_only_its_token():
    p = from_float(torch.randn(16, 256), "w4a16")
    st = w4_gemv.prepare(p)
    x = torch.randn(3, 256)
    clean = w4_gemv.run(x, st)
    for bad in (float("nan"), float("inf")):
        xb = x.clone()
        xb[1, 7] = bad
        y = w4_gemv.run(xb, st)
        assert torch.isnan(y[1]).all()
        assert torch.equal(y[0], clean[0]) and torch.equal(y[2], clean[2])


def test_bfloat16_in_and_out_is_the_float_path_rounded():
    """bf16 → f32 is exact and the C rounding back is torch's round-to-nearest-even: same bits."""
    p = from_float(torch.randn(40, 576), "w4a16", bias=torch.randn(40))
    st = w4_gemv.prepare(p)
    x = (torch.randn(5, 576) * 4).bfloat16()
    y = w4_gemv.run(x, st)
    assert y.dtype == torch.bfloat16
    st.bias = None
    expect = w4_gemv.run(x.float(), st).bfloat16() + p.bias.bfloat16()
    assert torch.equal(y, expect)


def test_method_choice():
    expect = "gemm" if a16_gemm.simd() else "native"  # the batched kernel where its build has SIMD
    assert w4a16.default_method(from_float(torch.randn(16, 256), "w4a16", group=128)) == expect
    p32 = from_float(torch.randn(16, 256), "w4a16", group=32)
    assert w4a16.default_method(p32) == "int4pack"
    for method in ("native", "gemm"):
        with pytest.raises(KernelError, match="multiple of 64"):
            w4a16.prepare(p32, method)
    wide = from_float(torch.randn(4, 4160), "w4a16", group=0)  # one group of 4160 > MAX_GROUP
    assert w4a16.default_method(wide) == "int4pack"
    with pytest.raises(KernelError, match="overflow"):
        w4a16.prepare(wide, "native")


@pytest.mark.parametrize("n,group", [(200, 64), (130, 0), (576, 128)])
def test_activation_rounding_simd_equals_portable_on_bf16_and_ragged_groups(n, group):
    """The AVX2 activation rounding (8 values at a time, a scalar tail) gives the portable loop's
    bits, from bfloat16 and float32 rows, with a non-finite token in the batch."""
    lib = w4_gemv.library(w4_gemv.PORTABLE_FLAGS)
    if lib is None or not w4_gemv.library().w4_has_simd():
        pytest.skip("needs both the portable and the AVX2 build")
    p = _asymmetric(24, n, group or n, seed=3)
    if group == 0:
        p.group = 0
    st = w4_gemv.prepare(p)
    x = torch.randn(6, n) * torch.logspace(-3, 2, n)
    x[4, n // 2] = float("nan")
    x[5] = torch.randn(n) * 1e-42  # float32 subnormals: absmax/32767 underflows to zero
    for xi in (x, x.bfloat16()):
        y = w4_gemv.run(xi, st)
        torch.testing.assert_close(y, w4_gemv.run(xi, st, lib), rtol=0, atol=0, equal_nan=True)
        assert torch.isnan(y[4]).all() and not torch.isnan(y[:4]).any() and torch.isfinite(y[5]).all()


def test_run_codes_refuses_codes_a_cast_to_int16_would_change():
    """int32 40000 wrapped and float 0.7 truncated to 0 in the cast, silently."""
    w = w4_gemv.prepare(from_float(torch.randn(8, 128), "w4a16"))
    for codes in (torch.full((1, 128), 40000, dtype=torch.int32), torch.full((1, 128), 0.7)):
        with pytest.raises(ValueError, match="int8, uint8 or int16"):
            w4_gemv.run_codes(codes, torch.ones(1, 1), w)
    y = w4_gemv.run_codes(torch.ones(1, 128, dtype=torch.int8), torch.ones(1, 1), w)
    assert torch.equal(y, w4_gemv.run_codes(torch.ones(1, 128, dtype=torch.int16), torch.ones(1, 1), w))
