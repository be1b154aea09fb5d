"""FP4 E2M1 (FP16 / MXFP4 / NVFP4 scales) and FP8 through torch's float8 dtypes."""

import pytest
import torch

from lowbit.formats import E2M1_VALUES, FP4Format, FP8Format, e2m1_decode, e2m1_encode, fp4_dequantize, fp4_quantize
from lowbit.formats.fp8 import fp8_dequantize, fp8_quantize


def test_every_e2m1_value_round_trips():
    vals = torch.tensor([s * v for v in E2M1_VALUES for s in (1.0, -1.0)])
    assert torch.equal(e2m1_decode(e2m1_encode(vals)), vals)


def test_e2m1_ties_go_to_even_code():
    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    assert e2m1_decode(e2m1_encode(mids)).tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]
    assert e2m1_decode(e2m1_encode(-mids)).tolist() == [-0.0, -1.0, -1.0, -2.0, -2.0, -4.0, -4.0]


def test_e2m1_nearest_and_saturating():
    v = torch.linspace(-8, 8, 1001)
    table = torch.tensor(E2M1_VALUES)
    full = torch.cat([-table, table])
    got = e2m1_decode(e2m1_encode(v))
    nearest_dist = (v[:, None].clamp(-6, 6) - full[None]).abs().min(dim=1).values
    assert torch.allclose((got - v.clamp(-6, 6)).abs(), nearest_dist)


@pytest.mark.parametrize("kind", ["fp16", "e8m0", "e4m3"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_fp4_block_error_within_one_scale(kind, dtype):
    x = (torch.randn(8, 96) * torch.logspace(-2, 2, 96)).to(dtype)
    q = fp4_quantize(x, kind)
    x_hat = fp4_dequantize(q, dtype)
    assert x_hat.dtype == dtype
    eff = q.scale * (q.global_scale if q.global_scale is not None else 1.0)
    per_el = eff.repeat_interleave(q.block).reshape(x.shape)
    inside = x.float().abs() <= 6 * per_el  # MXFP4's power-of-two scale can leave the top saturated
    err = (x.float() - x_hat.float()).abs()
    tol = torch.finfo(dtype).eps * x_hat.float().abs() + 1e-6 * per_el
    assert bool((err <= per_el + tol)[inside].all())


def test_mxfp4_scale_is_power_of_two_and_nvfp4_scale_is_e4m3():
    x = torch.randn(4, 64)
    mx = fp4_quantize(x, "e8m0")
    assert torch.equal(torch.exp2(torch.log2(mx.scale).round()), mx.scale)
    nv = fp4_quantize(x, "e4m3")
    assert nv.block == 16 and nv.global_scale is not None
    assert torch.equal(nv.scale.to(torch.float8_e4m3fn).float(), nv.scale)


def test_fp4_zero_block_and_empty():
    x = torch.zeros(2, 32)
    assert torch.equal(fp4_dequantize(fp4_quantize(x)), x)
    e = torch.empty(0, 32)
    assert fp4_dequantize(fp4_quantize(e)).shape == (0, 32)


def test_fp4_rejects_nan_and_unknown_scale():
    with pytest.raises(ValueError, match="NaN"):
        fp4_quantize(torch.tensor([1.0, float("nan")]))
    with pytest.raises(ValueError, match="scale_kind"):
        fp4_quantize(torch.randn(32), "e3m2")


@pytest.mark.parametrize("kind", ["e4m3", "e5m2"])
def test_fp8_relative_error(kind):
    x = torch.randn(64, 64)
    q, s = fp8_quantize(x, kind)
    assert q.dtype == (torch.float8_e4m3fn if kind == "e4m3" else torch.float8_e5m2)
    x_hat = fp8_dequantize(q, s)
    rel = 2.0 ** -(4 if kind == "e4m3" else 3)  # half an ulp: 3 (2) mantissa bits
    normal = x.abs() > s * 2.0 ** (-6 if kind == "e4m3" else -14)
    assert bool(((x - x_hat).abs() <= rel * x.abs() + 1e-7)[normal].all())
    assert float((x - x_hat).abs().max()) <= FP8Format(kind).error_bound(x) * 1.0001


def test_format_objects_agree_with_functions():
    x = torch.randn(16, 64)
    assert torch.equal(FP4Format("fp16").fake_quantize(x), fp4_dequantize(fp4_quantize(x, "fp16")))
