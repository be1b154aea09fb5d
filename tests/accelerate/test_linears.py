"""KernelLinear built from a real QuantLinear computes what the QuantLinear computes."""

import pytest
import torch
from torch import nn

from lowbit.accelerate import KernelLinear, accelerate
from lowbit.kernels import from_quant_linear
from lowbit.kernels.cpu import w4a4
from lowbit.nn.quant_linear import QuantLinear
from lowbit.formats.scheme import ActArgs, WeightArgs
from lowbit.formats.quantized_weight import rtn


def _ql(kind: str, n_in=288, out=48, k=0, perm=False, bias=True):
    torch.manual_seed(3)
    w = torch.randn(out, n_in)
    bits = 4 if kind in ("w4a16", "w4a4") else 8
    g = 128 if bits == 4 else 0
    act = {"w4a16": None, "w8a8": ActArgs(bits=8, group_size=0), "w4a4": ActArgs(bits=4, group_size=128, clip_ratio=0.9)}[kind]
    qw = rtn(w, WeightArgs(bits=bits, group_size=g, symmetric=True), k, "int8")
    return QuantLinear.from_quantized(qw, act, torch.randperm(n_in) if perm else None,
                                      torch.randn(out) if bias else None, "int8")


@pytest.mark.parametrize("kind,k,perm,rtol", [("w4a4", 32, True, 1e-4), ("w4a4", 0, False, 1e-4),
                                             ("w8a8", 0, True, 1e-4), ("w4a16", 0, False, 2e-2)])
def test_kernel_linear_matches_quant_linear(kind, k, perm, rtol):
    ql = _ql(kind, k=k, perm=perm)
    kl = KernelLinear.from_quant_linear(ql)
    assert kl.prepared.kernel.startswith("cpu")
    x = torch.randn(2, 5, 288)
    y_ref, y = ql(x), kl(x)
    assert y.shape == y_ref.shape
    scale = float((x.reshape(-1, 288).abs() @ ql.dequantized_weight().abs().t()).max())
    assert torch.allclose(y, y_ref, rtol=rtol, atol=rtol * scale)


def test_the_reorder_goes_to_the_kernel():
    """A layer's input reorder is handed to the kernel (W4A4's batched kernel reads x through it in
    C) instead of a torch gather before it: the same bits as gathering first."""
    ql = _ql("w4a4", k=32, perm=True, bias=False)
    kl = KernelLinear.from_quant_linear(ql)
    assert kl.input_perm is None and torch.equal(kl.prepared.input_perm, ql.input_perm)
    plain = KernelLinear.from_quant_linear(_ql("w4a4", k=32, bias=False))  # the same weight, no reorder
    x = torch.randn(2, 5, 288)
    for xx in (x, x.bfloat16()):
        assert torch.equal(kl(xx), plain(xx[..., ql.input_perm]))


def test_params_dequantize_equals_module():
    ql = _ql("w4a4", k=32)
    assert torch.equal(from_quant_linear(ql).dequantize(), ql.dequantized_weight())


def test_accelerate_swaps_supported_layers_only():
    fp4 = QuantLinear.from_quantized(
        rtn(torch.randn(16, 128), WeightArgs(bits=4, group_size=32, format="fp4"), 0, "int8"), None, None, None, "int8")
    w4a4_linear = _ql("w4a4", k=32)
    method = w4a4.default_method(from_quant_linear(w4a4_linear))  # the GEMV or the batched kernel, by build
    model = nn.Sequential(w4a4_linear, nn.ReLU(), fp4)
    counts = accelerate(model)
    assert isinstance(model[0], KernelLinear) and isinstance(model[2], QuantLinear)
    assert counts == {f"w4a4:cpu:{method}": 1, "kept_reference": 1}


def test_asymmetric_w4a16_layer():
    torch.manual_seed(4)
    w = torch.randn(40, 256) + 0.5
    qw = rtn(w, WeightArgs(bits=4, group_size=64, symmetric=False), 0, "int8")
    ql = QuantLinear.from_quantized(qw, None, None, None, "int8")
    p = from_quant_linear(ql)
    assert p.zero is not None and torch.allclose(p.dequantize(), ql.dequantized_weight(), atol=1e-6)
    kl = KernelLinear.from_quant_linear(ql)
    x = torch.randn(3, 256)
    mag = x.abs() @ ql.dequantized_weight().abs().t()
    assert torch.all((kl(x) - ql(x)).abs() <= 2.0 ** -7 * mag + 1e-6)


@pytest.mark.parametrize("kind,method,mod", [("w4a16", "native", "cpu.w4_gemv"), ("w8a16", "native", "cpu.w8_gemv"),
                                             ("w4a16", "gemm", "cpu.a16_gemm"), ("w8a16", "gemm", "cpu.a16_gemm")])
def test_native_weights_deep_copy_their_own_pointers(kind, method, mod):
    """The native kernels cache raw pointers: a deep copy must point at its own tensors, so it
    still computes after the original is gone."""
    import copy
    import importlib

    from lowbit.kernels import from_float, prepare

    m = importlib.import_module(f"lowbit.kernels.{mod}")
    if not m.available():
        pytest.skip("no C compiler for the native kernel")
    st = prepare(from_float(torch.randn(8, 128), kind), cpu_method=method).state
    twin = copy.deepcopy(st)
    assert twin.args[0] == (twin.panels if method == "gemm" else twin.packed).data_ptr() != st.args[0]
    x = torch.randn(2, 128)
    expect = m.run(x, st)
    del st
    assert torch.equal(m.run(x, twin), expect)


def test_a_saved_model_runs_in_a_new_process(tmp_path):
    """torch.save(model) kept the native kernels' cached raw pointers; loaded in another process they
    pointed nowhere (a segfault). Unpickling now rebuilds them from the loaded tensors."""
    import subprocess
    import sys

    model = nn.Sequential(*(KernelLinear.from_quant_linear(_ql(kind, k=k, perm=perm, out=288))
                            for kind, k, perm in (("w4a16", 0, False), ("w8a8", 0, True), ("w4a4", 32, True))))
    x = torch.randn(3, 288)
    torch.save({"model": model, "x": x}, tmp_path / "m.pt")
    code = ("import sys, torch; d = torch.load(sys.argv[1], weights_only=False); "
            "torch.save(d['model'](d['x']), sys.argv[2])")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "m.pt"), str(tmp_path / "y.pt")],
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
    assert torch.equal(torch.load(tmp_path / "y.pt"), model(x))
