"""QuantizedWeight's views (signed codes, packed codes, the INT8 outlier block, from_packed)
equal the computations QuantLinear and the kernels did by hand, bit for bit; a view a grid
does not have is a clear error."""

import pytest
import torch

from lowbit.errors import LowbitError
from lowbit.formats import pack
from lowbit.formats.quantized_weight import QuantizedWeight, WeightViewError, rtn
from lowbit.formats.scheme import WeightArgs


def _w(out=8, n_in=80, seed=0):
    return torch.randn(out, n_in, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("bits,group,k", [(4, 32, 16), (8, 0, 0), (4, 0, 8), (3, 16, 0)])
def test_signed_codes_and_outliers_equal_the_old_derivation(bits, group, k):
    qw = rtn(_w(), WeightArgs(bits=bits, group_size=group, symmetric=True), k, "int8")
    assert torch.equal(qw.signed_codes(), (qw.codes.to(torch.int16) - 2 ** (bits - 1)).to(torch.int8))
    codes, scale = qw.int8_outliers()
    assert codes.dtype == torch.int8 and codes.shape == (8, k) and scale.dtype == torch.float32
    assert torch.equal(codes, qw.outlier) and torch.equal(scale, qw.outlier_scale.float())


def test_packed_codes_round_trip_through_from_packed():
    qw = rtn(_w(n_in=70), WeightArgs(bits=4, group_size=32, symmetric=False), 6, "int8")
    packed = qw.packed_codes()
    assert torch.equal(packed, pack(qw.codes, 4))
    back = QuantizedWeight.from_packed(packed, qw.codes.shape[1], qw.scale.half(), qw.zero.to(torch.uint8), qw.outlier,
                                       qw.outlier_scale.half(), qw.grid, qw.group)
    assert torch.equal(back.codes, qw.codes) and torch.equal(back.zero, qw.zero)
    assert back.zero.dtype == torch.int32 and back.scale.dtype == torch.float32
    assert torch.equal(back.dequantize(), qw.dequantize())


def test_views_a_grid_does_not_have():
    asym = rtn(_w(), WeightArgs(bits=4, group_size=32, symmetric=False), 0, "int8")
    fp4 = rtn(_w(), WeightArgs(bits=4, group_size=32, format="fp4"), 0, "int8")
    for qw in (asym, fp4):
        with pytest.raises(WeightViewError, match="symmetric INT"):
            qw.signed_codes()
    fp16_outliers = rtn(_w(), WeightArgs(bits=4, group_size=32), 8, "fp16")
    with pytest.raises(LowbitError, match="FP16"):
        fp16_outliers.int8_outliers()


def test_no_outliers_give_an_empty_block_and_unit_scales():
    qw = rtn(_w(), WeightArgs(bits=4, group_size=32), 8, "fp16")
    none = QuantizedWeight(qw.codes, qw.scale, None, torch.zeros(8, 0, dtype=torch.float16), None, qw.grid, 32)
    codes, scale = none.int8_outliers()
    assert codes.shape == (8, 0) and codes.dtype == torch.int8 and torch.equal(scale, torch.ones(8))
