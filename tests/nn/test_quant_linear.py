import pytest
import torch

from lowbit.formats import PerGroup, PerToken, fake_quantize, packed_size
from lowbit.nn import QuantLinear, module_bytes, quantize_activation, reference_quant_matmul
from lowbit.formats.scheme import ActArgs, WeightArgs
from lowbit.formats.quantized_weight import rtn


def _layer(k=16, act=ActArgs(bits=4, group_size=128, clip_ratio=0.9), perm=True, bias=True, w_bits=4):
    torch.manual_seed(0)
    w = torch.randn(64, 300) * 0.05
    p = torch.randperm(300) if perm else None
    b = torch.randn(64) if bias else None
    qw = rtn(w, WeightArgs(bits=w_bits, group_size=128), n_outliers=k)
    return QuantLinear.from_quantized(qw, act, p, b, "int8"), qw, p, b


def test_forward_equals_independent_fake_quant_pipeline():
    m, qw, p, b = _layer()
    x = torch.randn(3, 5, 300) * torch.linspace(0.1, 4, 300)
    xp = x.reshape(-1, 300)[:, p]
    normal, _ = fake_quantize(xp[:, :284], 4, granularity=PerGroup(128), clip_ratio=0.9)
    outl, _ = fake_quantize(xp[:, 284:], 8, granularity=PerToken())
    want = torch.cat([normal, outl], 1) @ qw.dequantize().t() + b
    got = m(x)
    assert got.shape == (3, 5, 64)
    torch.testing.assert_close(got.reshape(-1, 64), want, rtol=1e-5, atol=1e-5)


def test_weights_are_really_packed():
    m, qw, _, _ = _layer(k=16)
    assert m.qweight.dtype == torch.uint8 and m.qweight.shape == (64, packed_size(284, 4)) == (64, 142)
    assert m.wscale.dtype == torch.float16 and m.outlier_weight.dtype == torch.int8
    assert torch.equal(m.quantized_weight().codes, qw.codes)
    float_bytes = 64 * 300 * 4
    assert module_bytes(m) < float_bytes / 5


def test_activation_codes_are_real_and_reference_matmul_uses_them():
    x = torch.randn(7, 300)
    qa = quantize_activation(x, ActArgs(bits=4, group_size=128), n_outliers=16)
    assert qa.codes.dtype == torch.uint8 and int(qa.codes.max()) <= 15 and qa.outlier.dtype == torch.int8
    w = torch.randn(5, 300)
    torch.testing.assert_close(reference_quant_matmul(qa, w), qa.dequantize() @ w.t())
    assert (qa.dequantize() - x).abs().max() < x.abs().max() / 4


def test_float_weight_variant_and_no_act_quant():
    torch.manual_seed(1)
    w = torch.randn(8, 40)
    m = QuantLinear.from_float(w, None, None, None, 0, "int8")
    x = torch.randn(2, 40)
    torch.testing.assert_close(m(x), x @ w.t())


@pytest.mark.parametrize("fmt,bits", [("fp4", 4), ("int", 3), ("int", 8)])
def test_other_grids_round_trip(fmt, bits):
    torch.manual_seed(2)
    w = torch.randn(16, 96) * 0.1
    qw = rtn(w, WeightArgs(bits=bits, group_size=32, format=fmt), n_outliers=8)
    m = QuantLinear.from_quantized(qw, ActArgs(bits=bits, group_size=32, format=fmt), None, None, "int8")
    torch.testing.assert_close(m.dequantized_weight(), qw.dequantize())
    assert m.qweight.shape[1] == packed_size(88, bits)
