"""Activation codes in C (csrc/act_sym.h) are the torch reference's bits (act_quant.quantize_tokens),
and the W4A4 / W8A8 native paths built on them give what the torch codes gave."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from lowbit.kernels.cpu import w4_gemv, w4a4, w8_gemv, w8a8, act_sym
from lowbit.kernels import from_float
from lowbit.kernels.token_codes import quantize_tokens
from lowbit.kernels.linear_params import ActSpec

pytestmark = pytest.mark.skipif(not (w4_gemv.available() and w8_gemv.available()),
                                reason="no C compiler for the native kernels")


def _torch_codes(x, act, k, group, kp):
    a = quantize_tokens(x, act, k)
    t, n = a.codes.shape
    xq = torch.nn.functional.pad(a.codes.to(torch.int16), (0, kp - n))
    return a, xq


@given(t=st.integers(0, 5), n=st.integers(1, 300), k=st.integers(0, 40), group=st.sampled_from([0, 32, 64, 128]),
       bits=st.sampled_from([3, 4, 8]), clip=st.sampled_from([1.0, 0.9, 0.85, 0.77]), bf16=st.booleans(),
       scale=st.sampled_from([1e-30, 1e-3, 1.0, 50.0, 1e30]), seed=st.integers(0, 2 ** 16), half=st.booleans())
def test_codes_equal_torch_bit_for_bit(t, n, k, group, bits, clip, bf16, scale, seed, half):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, n + k, generator=g) * scale
    if t and seed % 3 == 0:  # ties of magnitude with both signs, and whole zero groups
        x[0, : min(4, n)] = torch.tensor([-2.0, 2.0, -2.0, 2.0][: min(4, n)]) * scale
        x[-1, :] = 0.0
    if bf16:
        x = x.bfloat16()
    act = ActSpec(bits, group, clip, "compressed-tensors" if half else "signed")
    gsz = group or n
    ng = -(-n // gsz)
    kp = -(-n // 64) * 64
    ref, xq = _torch_codes(x, act, k, gsz, kp)
    c = act_sym.symmetric_codes(w4_gemv.library().w4_act_sym, x, k, gsz, ng, kp, bits, clip, half)
    assert torch.equal(c.xq, xq)
    assert torch.equal(c.scale, ref.scale)
    assert torch.equal(c.outlier, ref.outlier.to(torch.int16))
    assert torch.equal(c.outlier_scale, ref.outlier_scale if k else torch.ones(t))
    sums = torch.nn.functional.pad(xq, (0, ng * gsz - kp)).reshape(t, ng, gsz).sum(-1, dtype=torch.int32) \
        if ng * gsz >= kp else None
    if sums is not None:
        assert torch.equal(c.xsum, sums)


@pytest.mark.parametrize("bits", [4, 8])
def test_ties_zeros_and_tails_of_the_vector_loops(bits):
    """75 channels: 9 vectors of 8 and a scalar tail of 3. Ties of the largest magnitude with both
    signs inside the vectors, inside the tail and across the two (the first wins, as torch.argmax),
    an all-zero row led by -0.0, and a NaN in the tail, for the libraries whose builds vectorize."""
    from lowbit.kernels.cpu import i8_gemm

    x = torch.randn(4, 75)
    x[0, 10], x[0, 20] = -5.0, 5.0
    x[1, 73], x[1, 74] = 5.0, -5.0
    x[2, 3], x[2, 74] = 7.0, -7.0
    x[3] = 0.0
    x[3, 0] = -0.0
    act = ActSpec(bits, 0, 0.9)
    ref, xq = _torch_codes(x, act, 0, 75, 128)
    for fn in (w4_gemv.library().w4_act_sym, i8_gemm.library().i8_act_sym):
        c = act_sym.symmetric_codes(fn, x, 0, 75, 1, 128, bits, 0.9)
        assert torch.equal(c.xq, xq) and torch.equal(c.scale, ref.scale)
        bad = x.clone()
        bad[1, 74] = float("nan")
        with pytest.raises(ValueError, match="NaN or Inf"):
            act_sym.symmetric_codes(fn, bad, 0, 75, 1, 128, bits, 0.9)


def test_nan_or_inf_is_refused_like_torch():
    lib = w4_gemv.library()
    for bad in (float("nan"), float("inf"), -float("inf")):
        x = torch.randn(3, 128)
        x[1, 5] = bad
        with pytest.raises(ValueError, match="NaN or Inf"):
            quantize_tokens(x, ActSpec(4, 64, 1.0))
        with pytest.raises(ValueError, match="NaN or Inf"):
            act_sym.symmetric_codes(lib.w4_act_sym, x, 0, 64, 2, 128, 4, 1.0)


def test_bad_layout_is_an_error_not_a_write():
    lib = w4_gemv.library()
    with pytest.raises(ValueError, match="layout"):
        act_sym.symmetric_codes(lib.w4_act_sym, torch.randn(2, 128), 0, 64, 1, 128, 4, 1.0)  # 1 group of 64 < 128
    with pytest.raises(ValueError, match="layout"):
        act_sym.symmetric_codes(lib.w4_act_sym, torch.randn(2, 128), 0, 64, 2, 64, 4, 1.0)  # padded width < n
    with pytest.raises(ValueError, match="tokens, features"):
        act_sym.symmetric_codes(lib.w4_act_sym, torch.randn(128), 0, 64, 2, 128, 4, 1.0)


@pytest.mark.parametrize("t,out,n_in,k", [(1, 64, 256, 32), (5, 40, 576, 32), (3, 24, 320, 0), (17, 16, 128, 8)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_w4a4_native_equals_torch_codes_path(t, out, n_in, k, dtype):
    """Both parts in C give torch's codes' products, bit for bit."""
    torch.manual_seed(t + out)
    p = from_float(torch.randn(out, n_in), "w4a4", group=64, n_outliers=k, act_clip=0.9, bias=torch.randn(out))
    w = w4a4.prepare(p, "native")
    x = (torch.randn(t, n_in) * 3).to(dtype)
    a = quantize_tokens(x, w.act, k)
    expect = w4_gemv.run_codes(a.codes, a.scale, w.normal)
    if k:  # the exact INT8 product P, rescaled as float(P) * (w_scale * x_scale)
        p_int = a.outlier.double() @ p.outlier.double().t()
        expect += p_int.float() * (p.outlier_scale[None, :] * a.outlier_scale[:, None])
    assert torch.equal(w4a4.run(x, w), expect + w.bias)


@pytest.mark.parametrize("t,out,n_in", [(1, 64, 256), (6, 36, 200), (9, 16, 4096)])
@pytest.mark.parametrize("rule", ["signed", "compressed-tensors"])
def test_w8a8_native_equals_float_method(t, out, n_in, rule):
    torch.manual_seed(t)
    p = from_float(torch.randn(out, n_in), "w8a8", bias=torch.randn(out))
    p.act = ActSpec(8, 0, 1.0, rule)
    x = torch.randn(t, n_in) * 4
    y = w8a8.run(x, w8a8.prepare(p, "native"))
    assert torch.equal(y, w8a8.run(x, w8a8.prepare(p, "float")))
    p.act = ActSpec(8, 0, 1.0, "compressed-tensors" if rule == "signed" else "signed")
    assert not torch.equal(w8a8.run(x, w8a8.prepare(p, "native")), y)  # the rule reaches the C codes



@pytest.mark.parametrize("t", [8, 17, 64])
def test_w8a8_int_mm_for_batches_gives_the_native_bits(t, monkeypatch):
    """Large calls on AMX CPUs run torch._int_mm on the native layout's bytes: the same bits as the
    native GEMV and the float method (forced on here, whatever this CPU has)."""
    from lowbit.kernels.cpu.method_choice import int_mm_exact

    if int_mm_exact():
        pytest.skip(int_mm_exact())
    torch.manual_seed(t)
    p = from_float(torch.randn(36, 300), "w8a8", bias=torch.randn(36))
    w = w8a8.prepare(p, "native")
    x = torch.randn(t, 300) * 4
    monkeypatch.setattr(w8a8, "int_mm_for_batches", lambda: False)
    gemv = w8a8.run(x, w)
    monkeypatch.setattr(w8a8, "int_mm_for_batches", lambda: True)
    assert torch.equal(w8a8.run(x, w), gemv)
    assert torch.equal(gemv, w8a8.run(x, w8a8.prepare(p, "float")))


def test_many_tokens_share_the_pool_with_the_same_bits():
    """From 17 tokens the codes are computed in blocks of 16 over the work pool: torch's bits for
    any thread count, and a NaN in a late block is still refused."""
    from tests.threads import assert_same_for_thread_counts

    torch.manual_seed(0)
    x = torch.randn(75, 300) * torch.linspace(0.1, 5, 300)
    act = ActSpec(4, 64, 0.9)
    ref, xq = _torch_codes(x, act, 12, 64, 320)
    lib = w4_gemv.library()
    codes = lambda: act_sym.symmetric_codes(lib.w4_act_sym, x, 12, 64, 5, 320, 4, 0.9)  # noqa: E731
    c = codes()
    assert torch.equal(c.xq, xq) and torch.equal(c.scale, ref.scale)
    assert torch.equal(c.outlier, ref.outlier.to(torch.int16)) and torch.equal(c.outlier_scale, ref.outlier_scale)
    assert_same_for_thread_counts(lambda: codes().xq, c.xq)
    x[70, 3] = float("nan")
    with pytest.raises(ValueError, match="NaN or Inf"):
        codes()


def test_int_mm_rescale_refuses_a_wrong_product():
    w = w8a8.prepare(from_float(torch.randn(36, 300), "w8a8"), "native").weight
    with pytest.raises(ValueError, match="int32"):
        w8_gemv.rescale(torch.zeros(4, 20, dtype=torch.int32), torch.ones(4, 1), w)
    with pytest.raises(ValueError, match="int32"):
        w8_gemv.rescale(torch.zeros(4, 48), torch.ones(4, 1), w)


def near_half_integers(t: int, n: int, span: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(x [t, n], step [t, 1]): x / step within 3 ulps of half-integers m + 1/2, |m + 1/2| < span, for
    steps spread over 12 decades; there x * (1 / step) and x / step can round to different codes."""
    g = torch.Generator().manual_seed(seed)
    step = 10 ** (torch.rand(t, 1, generator=g) * 12 - 6)
    x = (torch.randint(-span, span - 1, (t, n), generator=g).float() + 0.5) * step
    nudge = torch.randint(-3, 4, (t, n), generator=g)
    for k in range(3):
        x = torch.where(nudge > k, torch.nextafter(x, torch.tensor(float("inf"))), x)
        x = torch.where(nudge < -k, torch.nextafter(x, torch.tensor(-float("inf"))), x)
    return x, step


def product_rounds_differently(x: torch.Tensor, step: torch.Tensor) -> int:
    """How many values' codes a product by the reciprocal would get wrong (the cases the kernels
    must divide)."""
    return int((torch.round(x * (1 / step)) != torch.round(x / step)).sum())


@pytest.mark.parametrize("bits", [4, 8])
def test_codes_near_half_integers_are_the_division(bits):
    """Values made to lie within ulps of rounding boundaries, where a product by 1/s (a tempting
    speed-up: it was tried and gained nothing) rounds differently than the division: torch's bits."""
    from lowbit.kernels.cpu import i8_gemm

    lo = 2 ** (bits - 1)
    x, step = near_half_integers(64, 255, lo, seed=bits)
    x = torch.cat([-lo * step, x], 1)  # the absmax, negative: s = (-lo * step) / -lo = step exactly
    assert product_rounds_differently(x, step) > 0
    act = ActSpec(bits, 0, 1.0)
    ref, xq = _torch_codes(x, act, 0, 256, 256)
    for fn in (w4_gemv.library().w4_act_sym, i8_gemm.library().i8_act_sym):
        c = act_sym.symmetric_codes(fn, x, 0, 256, 1, 256, bits, 1.0)
        assert torch.equal(c.scale, ref.scale)
        assert torch.equal(c.xq, xq)
