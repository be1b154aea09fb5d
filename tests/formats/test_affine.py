"""The affine map: the |x − x̂| ≤ |scale|/2 bound, exact zeros, ranges, rounding, bad input."""

import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

from lowbit.formats import PerChannel, PerGroup, PerTensor, PerToken, choose_qparams, dequantize, quantize, qrange
from lowbit.formats.affine import block_scale_per_element, in_range

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@st.composite
def granularities(draw, ndim):
    kind = draw(st.sampled_from(["tensor", "channel", "group", "token"]))
    if kind == "tensor":
        return PerTensor()
    if kind == "channel":
        return PerChannel(draw(st.integers(-ndim, ndim - 1)))
    if kind == "group":
        return PerGroup(draw(st.sampled_from([1, 3, 7, 16, 32, 100, 128])))
    return PerToken()


@st.composite
def cases(draw):
    shape = tuple(draw(st.lists(st.integers(1, 40), min_size=1, max_size=3)))
    seed = draw(st.integers(0, 2**31 - 1))
    magnitude = 10.0 ** draw(st.integers(-4, 4))
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * magnitude
    if draw(st.booleans()):  # heavy-tailed: a few outliers, like real activations
        mask = torch.rand(shape, generator=g) < 0.02
        x = torch.where(mask, x * 50, x)
    if draw(st.booleans()):  # exact zeros sprinkled in
        x = torch.where(torch.rand(shape, generator=g) < 0.1, torch.zeros_like(x), x)
    dtype = draw(st.sampled_from(DTYPES))
    if dtype == torch.float16:
        x = x.clamp(-3e4, 3e4)  # stay finite in fp16; NaN/Inf rejection is tested separately
    return x.to(dtype), draw(granularities(len(shape)))


def slack(x, x_hat, scale_el, bits):
    """Float rounding on top of |s|/2, justified term by term.

    * x/s and q·s are computed in fp32: each costs at most 2^-24 relative, so a quotient near a
      rounding tie may round the other way and q·s may be off by 2^-24·|q·s| ≤ 2^-24·|s|·2^b;
      2^-22 covers both with margin.
    * the result is cast back to the input dtype: half an ulp, eps/2 · |x̂|, and at least half the
      subnormal spacing (smallest_normal · eps/2: fp16 keeps only 2^-24 steps below 6.1e-5).
    """
    fi = torch.finfo(x.dtype)
    eps_out = fi.eps / 2
    return 2.0**-22 * (x.abs().float() + scale_el * 2**bits) + eps_out * x_hat.abs().float() + fi.smallest_normal * eps_out


@given(cases(), st.integers(2, 8), st.booleans(), st.booleans(), st.sampled_from([torch.float32, torch.float16]))
def test_error_bound_inside_range(case, bits, symmetric, full_range, scale_dtype):
    x, g = case
    if scale_dtype == torch.float16:
        assume(float(x.float().abs().max()) < 6e4)  # larger scales overflow fp16: tested separately
    qp = choose_qparams(x, bits, symmetric=symmetric, granularity=g, full_range=full_range, scale_dtype=scale_dtype)
    codes = quantize(x, qp)
    x_hat = dequantize(codes, qp, x.dtype)
    assert x_hat.dtype == x.dtype and x_hat.shape == x.shape
    lo, hi = qrange(bits, symmetric, full_range)
    assert int(codes.min()) >= lo and int(codes.max()) <= hi
    s = block_scale_per_element(qp, tuple(x.shape))
    err = (x.float() - x_hat.float()).abs()
    inside = in_range(x, qp)
    bound = s / 2 + slack(x, x_hat, s, bits)
    assert bool((err <= bound)[inside].all()), float((err - bound)[inside].max())
    if not symmetric or not full_range:
        # asymmetric and narrow symmetric grids cover every value of their block
        assert bool(inside.all())


@given(cases(), st.integers(2, 8))
def test_asymmetric_represents_zero_exactly(case, bits):
    x, g = case
    x = x.clone()
    x.view(-1)[:: 3] = 0
    qp = choose_qparams(x, bits, symmetric=False, granularity=g)
    x_hat = dequantize(quantize(x, qp), qp, x.dtype)
    assert bool((x_hat[x == 0] == 0).all())


@pytest.mark.parametrize("bits", range(2, 9))
def test_full_range_puts_signed_absmax_on_the_extra_negative_code(bits):
    for sign in (1.0, -1.0):
        x = torch.tensor([0.1, -0.3, 0.2, sign * 5.0])
        qp = choose_qparams(x, bits, symmetric=True, full_range=True)
        codes = quantize(x, qp)
        assert int(codes[3]) == -(2 ** (bits - 1))
        assert float(dequantize(codes, qp)[3]) == pytest.approx(sign * 5.0, rel=1e-6)


def test_narrow_range_is_symmetric_and_positive_scale():
    x = torch.tensor([1.0, -7.0, 3.0])
    qp = choose_qparams(x, 4, symmetric=True, full_range=False)
    assert float(qp.scale) == pytest.approx(1.0)
    assert quantize(x, qp).tolist() == [1, -7, 3]


def test_round_half_to_even():
    x = torch.tensor([-8.0, 0.5, 1.5, 2.5, -2.5, 3.5])
    qp = choose_qparams(x, 4, symmetric=True, full_range=True)
    assert float(qp.scale) == 1.0
    assert quantize(x, qp).tolist() == [-8, 0, 2, 2, -2, 4]


def test_clip_ratio_clamps_and_shrinks_scale():
    x = torch.tensor([[1.0, 2.0, 4.0, -8.0]])
    full = choose_qparams(x, 4, symmetric=True)
    clipped = choose_qparams(x, 4, symmetric=True, clip_ratio=0.5)
    assert float(clipped.scale) == pytest.approx(float(full.scale) * 0.5)
    assert int(quantize(x, clipped)[0, 3]) == -8  # the clipped value saturates on the grid end


@pytest.mark.parametrize("g", [PerTensor(), PerChannel(0), PerChannel(1), PerGroup(3), PerToken()])
@pytest.mark.parametrize("symmetric", [True, False])
def test_all_zero_blocks_give_exact_zeros(g, symmetric):
    x = torch.zeros(4, 10)
    x[0, :3] = torch.tensor([1.0, -2.0, 3.0])
    qp = choose_qparams(x, 4, symmetric=symmetric, granularity=g)
    x_hat = dequantize(quantize(x, qp), qp)
    assert not bool(torch.isnan(x_hat).any())
    assert bool((x_hat[1:] == 0).all())


def test_group_tail_is_handled():
    x = torch.randn(3, 130)
    qp = choose_qparams(x, 4, granularity=PerGroup(128))
    assert qp.scale.shape == (3 * 2,)
    # the 2-value tail group gets its own scale from its own values
    tail_absmax = x[:, 128:].abs().amax(dim=1)
    assert torch.allclose(qp.scale.abs()[1::2], tail_absmax / 8)


@pytest.mark.parametrize("symmetric", [True, False])
def test_empty_tensor(symmetric):
    x = torch.empty(0, 16)
    qp = choose_qparams(x, 4, symmetric=symmetric, granularity=PerToken())
    assert qp.scale.numel() == 0
    assert dequantize(quantize(x, qp), qp).shape == (0, 16)


@pytest.mark.parametrize("bits", [0, 1, 9, 16, -4, 4.0, True])
def test_bits_outside_range_rejected(bits):
    with pytest.raises(ValueError, match="bits"):
        choose_qparams(torch.randn(8), bits)


@pytest.mark.parametrize("gs", [0, -32])
def test_group_size_must_be_positive(gs):
    with pytest.raises(ValueError, match="group_size"):
        PerGroup(gs)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_nan_and_inf_rejected(bad):
    x = torch.randn(4, 8)
    x[2, 3] = bad
    with pytest.raises(ValueError, match="NaN/Inf"):
        choose_qparams(x, 4, granularity=PerGroup(4))


def test_non_float_input_rejected():
    with pytest.raises(TypeError, match="float32, float16 or bfloat16"):
        choose_qparams(torch.arange(8), 4)


def test_clip_ratio_validated():
    with pytest.raises(ValueError, match="clip_ratio"):
        choose_qparams(torch.randn(8), 4, clip_ratio=1.5)


def test_scale_overflow_in_fp16_is_an_error():
    with pytest.raises(ValueError, match="overflows"):
        choose_qparams(torch.tensor([1e9, 1.0]), 4, scale_dtype=torch.float16)


def test_blocks_mismatch_rejected():
    qp = choose_qparams(torch.randn(4, 8), 4, granularity=PerToken())
    with pytest.raises(ValueError, match="blocks"):
        quantize(torch.randn(5, 8), qp)


@given(cases(), st.integers(2, 8), st.booleans(), st.booleans())
def test_one_pass_requantize_equals_quantize_then_dequantize(case, bits, symmetric, full_range):
    from lowbit.formats.affine import requantize_values

    x, g = case
    qp = choose_qparams(x, bits, symmetric=symmetric, granularity=g, full_range=full_range)
    assert torch.equal(requantize_values(x, qp), dequantize(quantize(x, qp), qp, x.dtype))
