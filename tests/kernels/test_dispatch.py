"""Kernel choice by device, forcing by argument or LOWBIT_KERNEL, and clear errors."""

import pytest
import torch

from lowbit.kernels import KernelError, choose, from_float, linear, prepare, reference
from lowbit.kernels.cpu import w4a4
from lowbit.kernels import triton as triton_backend


def test_auto_on_cpu_picks_cpu_fast_paths():
    for kind in ("w4a16", "w8a16", "w8a8", "w4a4"):
        assert choose(kind, "cpu") == "cpu"


def test_auto_on_cuda_picks_triton_for_w4a4():
    expect = "triton" if triton_backend.available() else "reference"
    assert choose("w4a4", "cuda") == expect
    assert choose("w4a16", "cuda") == "reference"


def test_env_forces_reference(monkeypatch):
    monkeypatch.setenv("LOWBIT_KERNEL", "reference")
    p = from_float(torch.randn(16, 128), "w4a4")
    pl = prepare(p, "cpu")
    x = torch.randn(3, 128)
    assert pl.kernel == "reference"
    assert torch.equal(pl(x), reference.linear(x, p))
    # the argument wins over the env
    assert prepare(p, "cpu", kernel="cpu").kernel == f"cpu:{w4a4.default_method(p)}"
    assert prepare(p, "cpu", kernel="cpu", cpu_method="float").kernel == "cpu:float"


def test_forced_kernel_that_cannot_run_raises(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(KernelError, match="triton"):
        choose("w4a4", "cpu", "triton")
    with pytest.raises(KernelError, match="no Triton kernel"):
        choose("w8a16", "cpu", "triton")
    with pytest.raises(KernelError, match="tensors are on"):
        choose("w4a4", "cuda", "cpu")
    monkeypatch.setenv("LOWBIT_KERNEL", "fastest")
    with pytest.raises(KernelError, match="unknown kernel"):
        choose("w4a4", "cpu")


def test_prepared_linear_checks_input():
    pl = prepare(from_float(torch.randn(16, 128), "w8a8"), "cpu")
    with pytest.raises(ValueError, match="expects"):
        pl(torch.randn(3, 64))
    with pytest.raises(TypeError, match="floating"):
        pl(torch.ones(3, 128, dtype=torch.int64))
    with pytest.raises(KernelError, match="unknown kernel kind"):
        from_float(torch.randn(16, 128), "w2a2")


def test_linear_one_shot_matches_prepared():
    p = from_float(torch.randn(24, 256), "w4a16")
    x = torch.randn(2, 256)
    assert torch.equal(linear(x, p), prepare(p, "cpu")(x))


@pytest.mark.parametrize("kind,method,k", [("w4a4", "gemm", 16), ("w4a4", "native", 16), ("w4a16", None, 0)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_input_perm_is_the_gathered_input_bit_for_bit(kind, method, k, dtype):
    """A prepared linear with the layer's input reorder gives what gathering x first gives (the
    W4A4 gemm kernel reads x through the permutation, the others gather), bias included."""
    torch.manual_seed(3)
    p = from_float(torch.randn(40, 256), kind, n_outliers=k, bias=torch.randn(40))
    perm = torch.randperm(256)
    plain, permuted = prepare(p, cpu_method=method), prepare(p, cpu_method=method, input_perm=perm)
    x = torch.randn(2, 5, 256).to(dtype)
    want = plain.batched(x.index_select(-1, perm))
    got = permuted.batched(x)
    assert got.dtype == want.dtype == dtype and torch.equal(got, want)
    assert torch.equal(permuted(x[0]), plain(x[0].index_select(1, perm)))


def test_input_perm_is_checked_once():
    p = from_float(torch.randn(8, 64), "w4a4", n_outliers=0)
    with pytest.raises(ValueError, match="outside"):
        prepare(p, input_perm=torch.arange(64) + 1)
    with pytest.raises(ValueError, match="integer"):
        prepare(p, input_perm=torch.arange(32))


def test_input_perm_is_kept_apart_from_the_callers_tensor():
    """The W4A4 gemm plans its native order from the permutation once; the prepared linear keeps a
    copy, so an edit of the caller's tensor afterwards changes neither form of the call."""
    torch.manual_seed(4)
    p = from_float(torch.randn(40, 256), "w4a4", n_outliers=16)
    perm = torch.randperm(256)
    pl = prepare(p, cpu_method="gemm", input_perm=perm)
    x = torch.randn(3, 256)
    want = prepare(p, cpu_method="gemm")(x.index_select(1, perm.clone()))
    perm.copy_(torch.arange(256))
    assert torch.equal(pl(x), want) and torch.equal(pl.batched(x), want)
