"""Effective bits (codes + scales + zero points) and the SQNR measurement itself."""

import math

import pytest
import torch

from lowbit.formats import FP4Format, FP8Format, IntFormat, PerChannel, PerGroup, PerTensor, choose_qparams, dequantize, quantize, sqnr_db


@pytest.mark.parametrize(
    "fmt,expected",
    [
        (IntFormat(4, True, PerGroup(32)), 4.5),
        (IntFormat(3, True, PerGroup(32)), 3.5),
        (IntFormat(8, True, PerGroup(32)), 8.5),
        (IntFormat(4, False, PerGroup(128)), 4.25),
        (IntFormat(4, True, PerGroup(128)), 4.125),
        (FP4Format("fp16"), 4.5),
        (FP4Format("e8m0"), 4.25),
    ],
)
def test_effective_bits(fmt, expected):
    assert fmt.effective_bits((64, 1024)) == pytest.approx(expected)


def test_effective_bits_counts_tail_groups_and_global_scales():
    # 130 values per row in groups of 128: 2 scales per row
    assert IntFormat(4, True, PerGroup(128)).effective_bits((1, 130)) == pytest.approx((130 * 4 + 2 * 16) / 130)
    # per channel: one 16-bit scale per row of 576
    assert IntFormat(8, True, PerChannel(0)).effective_bits((10, 576)) == pytest.approx(8 + 16 / 576)
    # NVFP4: 8-bit scale per 16 plus one fp32 global scale
    assert FP4Format("e4m3").effective_bits((4, 64)) == pytest.approx(4.5 + 32 / 256)
    assert FP8Format("e4m3").effective_bits((4, 64)) == pytest.approx(8 + 32 / 256)


def test_error_bound_is_the_worst_case():
    x = torch.randn(32, 256)
    for fmt in [IntFormat(4, True, PerGroup(32), full_range=False), IntFormat(3, False, PerGroup(128)), FP4Format("fp16")]:
        err = (x - fmt.fake_quantize(x)).abs().max()
        assert float(err) <= fmt.error_bound(x) * (1 + 1e-5)


@pytest.mark.parametrize("bits", range(2, 9))
def test_uniform_data_sqnr_is_6_02_dB_per_bit(bits):
    """Textbook check: data uniform over a b-bit grid's 2^b cells gives SQNR = 6.02·b dB.

    The grid is the full-range symmetric one with scale s (codes -2^(b-1)..2^(b-1)-1), so its
    cells tile [-(2^(b-1)+1/2)s, (2^(b-1)-1/2)s]; the data fills exactly that interval and the
    scale is chosen from the data with the clip ratio that makes it s. The signal is measured as
    its variance (the mean, -s/2, is removed from both x and x̂, which leaves the noise unchanged),
    as in the textbook derivation SQNR = var(x) / (s²/12) = 2^(2b).
    """
    n, s = 2 ** (bits - 1), 1.0
    g = torch.Generator().manual_seed(bits)
    x = (torch.rand(1, 1 << 18, generator=g, dtype=torch.float64) * (2 * n) - (n + 0.5)) * s
    x = x.float()
    x[0, 0] = -(n + 0.5) * s  # the interval's end, so the signed absmax is known exactly
    qp = choose_qparams(x, bits, symmetric=True, granularity=PerTensor(), clip_ratio=n / (n + 0.5))
    assert float(qp.scale) == pytest.approx(s, rel=1e-6)
    x_hat = dequantize(quantize(x, qp), qp)
    mean = x.mean()
    assert sqnr_db(x - mean, x_hat - mean) == pytest.approx(6.02 * bits, abs=0.5)


def test_sqnr_edges():
    x = torch.randn(10)
    assert sqnr_db(x, x) == math.inf
    assert sqnr_db(torch.zeros(3), torch.ones(3)) == -math.inf
