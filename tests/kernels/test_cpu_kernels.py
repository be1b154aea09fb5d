"""Every CPU fast path against the reference, with the bound its arithmetic allows.

Integer kinds (W8A8, W4A4): integer products are exact, so they are compared with the float64
integer reference; the only error is float32 rescale/accumulation: |Δ| ≤ (n_groups + 3)·2^-24·
Σ|terms|. bf16 kinds (W4A16, W8A16): input and output are rounded to bf16 (8 significant
bits), so |Δ| ≤ 2^-7·Σ|x||w| against the float32 reference.
"""

import pytest
import torch

from lowbit.kernels.cpu import w4a4, w4a16, w8a8, w8a16
from lowbit.kernels import from_float, reference
from lowbit.kernels.cpu.method_choice import int_mm_exact
from lowbit.kernels.linear_params import KernelError

SHAPES = [(1, 40, 256), (5, 64, 576), (17, 33, 200), (0, 16, 128)]


def _case(t, out, n_in, kind, **kw):
    torch.manual_seed(t * 1000 + out)
    w = torch.randn(out, n_in)
    x = torch.randn(t, n_in) * 3
    return x, from_float(w, kind, bias=torch.randn(out), **kw)


@pytest.mark.parametrize("t,out,n_in", SHAPES)
@pytest.mark.parametrize("kind,mod,group,method", [("w4a16", w4a16, 128, "int4pack"), ("w4a16", w4a16, 64, "int4pack"),
                                                  ("w8a16", w8a16, 0, "int8pack")])
def test_bf16_paths_within_bound(t, out, n_in, kind, mod, group, method):
    x, p = _case(t, out, n_in, kind, group=group)
    y = mod.run(x, mod.prepare(p, method))
    ref = reference.linear(x, p)
    assert y.shape == (t, out) and y.dtype == torch.float32
    mag = x.abs() @ p.dequantize().abs().t() + p.bias.abs()
    assert torch.all((y - ref).abs() <= 2.0 ** -7 * mag + 1e-6)


@pytest.mark.parametrize("n_in", [1, 8, 15, 16, 17, 24, 200, 264])
@pytest.mark.parametrize("t", [1, 4, 17])
def test_int8pack_any_input_width(t, n_in):
    """torch's _weight_int8pack_mm segfaults or returns garbage for widths that are not a multiple
    of 16 on AVX-512 CPUs: the method pads, so every width (each side of the boundary) is right."""
    x, p = _case(t, 33, n_in, "w8a16")
    st = w8a16.prepare(p, "int8pack")
    assert st.weight.shape[1] % w8a16.INT8PACK_K == 0
    y = w8a16.run(x, st)
    mag = x.abs() @ p.dequantize().abs().t() + p.bias.abs()
    assert torch.all((y - reference.linear(x, p)).abs() <= 2.0 ** -7 * mag + 1e-6)


def test_int8pack_refuses_a_width_it_was_not_prepared_for():
    x, p = _case(2, 8, 32, "w8a16")
    st = w8a16.prepare(p, "int8pack")
    with pytest.raises(KernelError, match="int8pack"):
        w8a16.run(torch.randn(2, 40), st)


@pytest.mark.parametrize("t,out,n_in", SHAPES)
@pytest.mark.parametrize("kind,mod,k,method", [(kind, mod, k, m) for kind, mod, k in
                                              [("w8a8", w8a8, 0), ("w4a4", w4a4, 0), ("w4a4", w4a4, 32)]
                                              for m in mod.METHODS])
def test_integer_paths_exact_up_to_fp32_rescale(t, out, n_in, kind, mod, k, method):
    if method == "int_mm" and int_mm_exact():
        pytest.skip(int_mm_exact())  # refused there (tests/kernels/cpu/test_method_choice.py)
    x, p = _case(t, out, n_in, kind, n_outliers=k, act_clip=0.9)
    y = mod.run(x, mod.prepare(p, method))
    y64, mag = reference.integer_reference(x, p)
    ng = p.scale.shape[1]
    assert torch.all((y.double() - y64).abs() <= (ng + 3) * 2.0 ** -24 * mag + 1e-12)
    # and the float32 dequantize-then-matmul reference agrees to float32 accuracy
    assert torch.allclose(y, reference.linear(x, p), rtol=1e-4, atol=1e-4 * (float(mag.max()) if t else 1.0))


@pytest.mark.parametrize("kind,mod,k,n_in", [("w8a8", w8a8, 0, 2500), ("w4a4", w4a4, 1100, 1300),
                                             ("w4a4", w4a4, 32, 576)])
def test_float_method_is_bit_identical_to_int_mm(kind, mod, k, n_in):
    """float32 SGEMM on integer operands is exact below 2^24: same bits as _int_mm."""
    if int_mm_exact():
        pytest.skip(int_mm_exact())
    x, p = _case(4, 24, n_in, kind, n_outliers=k)
    x = x * 50  # large activations: the int8 outlier sums need the 1024-channel chunking
    assert torch.equal(mod.run(x, mod.prepare(p, "float")), mod.run(x, mod.prepare(p, "int_mm")))


def test_w4a4_ragged_group_is_padded_not_dropped():
    x, p = _case(3, 16, 160, "w4a4", n_outliers=0)  # 160 = 128 + a ragged group of 32
    y64, _ = reference.integer_reference(x, p)
    for method in w4a4.METHODS:
        if method == "int_mm" and int_mm_exact():
            continue  # refused there (tests/kernels/cpu/test_method_choice.py)
        y = w4a4.run(x, w4a4.prepare(p, method))
        assert torch.allclose(y.double(), y64, rtol=1e-5, atol=1e-4)


def test_prepare_rejects_wrong_layouts():
    _, p4 = _case(2, 16, 256, "w4a4", n_outliers=32)
    with pytest.raises(KernelError):
        w4a16.prepare(p4)
    with pytest.raises(KernelError):
        w8a8.prepare(p4)
    with pytest.raises(KernelError, match="method"):
        w4a4.prepare(p4, "vnni")
    _, p = _case(2, 16, 96, "w4a16", group=96)
    with pytest.raises(KernelError, match="group size"):
        w4a16.prepare(p, "int4pack")
    with pytest.raises(KernelError, match="method"):
        w4a16.prepare(p, "avx512")
