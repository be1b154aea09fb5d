"""LinearParams are views of one QuantizedWeight: from_float and from_quant_linear give, bit for
bit, the tensors the hand derivation gave before (signed codes, float32 scales, INT8 outliers),
and LinearParams.dequantize equals the module's dequantized weight."""

import pytest
import torch

from lowbit.formats.quantized_weight import rtn
from lowbit.formats.scheme import ActArgs, WeightArgs
from lowbit.kernels.linear_params import from_float, from_quant_linear
from lowbit.nn.quant_linear import QuantLinear


def _same(a, b):
    assert (a is None) == (b is None)
    if a is not None:
        assert a.dtype == b.dtype and torch.equal(a, b)


@pytest.mark.parametrize("kind,group,k", [("w4a16", 32, 0), ("w8a16", 0, 0), ("w8a8", 0, 0), ("w4a4", 64, 16)])
def test_from_float_equals_the_hand_derivation(kind, group, k):
    w = torch.randn(24, 192, generator=torch.Generator().manual_seed(3))
    p = from_float(w, kind, group=group, n_outliers=k, act_clip=0.9)
    bits = 4 if kind in ("w4a16", "w4a4") else 8
    g = group if bits == 4 else 0
    qw = rtn(w, WeightArgs(bits=bits, group_size=g, symmetric=True), k, "int8")
    _same(p.codes, (qw.codes.to(torch.int16) - qw.grid.offset).to(torch.int8))
    _same(p.scale, qw.scale.float())
    _same(p.outlier, qw.outlier)
    _same(p.outlier_scale, qw.outlier_scale.float())
    assert p.zero is None and p.group == g and p.kind == kind


@pytest.mark.parametrize("symmetric,k", [(True, 8), (False, 0), (True, 0)])
def test_from_quant_linear_equals_the_hand_derivation(symmetric, k):
    w = torch.randn(16, 136, generator=torch.Generator().manual_seed(4))
    qw = rtn(w, WeightArgs(bits=4, group_size=64, symmetric=symmetric), k, "int8")
    act = ActArgs(bits=4, group_size=64) if symmetric else None
    ql = QuantLinear.from_quantized(qw, act, None, torch.randn(16), "int8")
    p = from_quant_linear(ql)
    back = ql.quantized_weight()
    if symmetric:
        _same(p.codes, (back.codes.to(torch.int16) - back.grid.offset).to(torch.int8))
        assert p.zero is None
    else:
        _same(p.codes, back.codes)
        _same(p.zero, back.zero.to(torch.int32))
    _same(p.scale, ql.wscale.float())
    _same(p.outlier_scale, ql.outlier_scale.float())
    assert p.outlier.shape == (16, k) and p.outlier.dtype == torch.int8
    assert torch.equal(p.dequantize(), ql.dequantized_weight())
