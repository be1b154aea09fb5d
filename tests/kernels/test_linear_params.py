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


def _bad_params():
    """LinearParams whose tensors disagree in size (each once reached a kernel, which sized its reads
    from one of them: a read past the codes or zero points, a segfault, or only group 0 used)."""
    from dataclasses import replace

    w4 = from_float(torch.randn(64, 2048), "w4a16", group=64)
    asym = replace(w4, codes=(w4.codes.to(torch.int16) + 8).to(torch.uint8),
                   zero=torch.full((64, 32), 8, dtype=torch.int32))
    w8 = from_float(torch.randn(4, 64), "w8a16")
    a4 = from_float(torch.randn(16, 160), "w4a4", group=64, n_outliers=32)
    return {"zero of fewer groups than the scales": (replace(asym, zero=asym.zero[:, :1].contiguous()), "zero"),
            "scales of far more rows than the codes": (replace(w8, scale=torch.rand(1 << 20, 1)), "scale"),
            "scales of one group for 32": (replace(w4, scale=w4.scale[:, :1].contiguous()), "scale"),
            "outlier rows short": (replace(a4, outlier=a4.outlier[:8]), "outlier"),
            "outlier scales short": (replace(a4, outlier_scale=a4.outlier_scale[:8]), "outlier_scale"),
            "bias short": (replace(w8, bias=torch.randn(1)), "bias")}


@pytest.mark.parametrize("case", list(_bad_params()))
def test_params_whose_sizes_disagree_are_refused_by_every_prepare(case):
    from lowbit.kernels import dispatch
    from lowbit.kernels.cpu import a16_gemm, w4_gemv

    p, name = _bad_params()[case]
    routes = [lambda: dispatch.prepare(p, kernel="reference")]
    for m in {"w4a16": ("native", "gemm", "int4pack"), "w8a16": ("native", "gemm", "int8pack"),
              "w4a4": ("native", "gemm", "float", "int_mm")}[p.kind]:
        routes += [lambda m=m: dispatch.prepare(p, cpu_method=m), lambda m=m: dispatch._CPU[p.kind].prepare(p, m)]
    if p.kind == "w4a16":
        routes += [lambda: w4_gemv.prepare(p), lambda: a16_gemm.prepare_w4(p)]
    for route in routes:
        with pytest.raises(ValueError, match=f"{name} must be"):
            route()


def test_w8_native_prepare_takes_one_scale_per_row():
    """Its row count came from the scales: 4 rows of codes with 2^20 scales were read far past."""
    from lowbit.kernels.cpu import w8_gemv

    with pytest.raises(ValueError, match="one scale per row"):
        w8_gemv.prepare(torch.zeros(4, 64, dtype=torch.int8), torch.rand(1 << 20))
    assert w8_gemv.prepare(torch.zeros(4, 64, dtype=torch.int8), torch.rand(4, 1)).scale.shape == (4,)
