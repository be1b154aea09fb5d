"""The online Hadamards in C (``csrc/hadamard.c``) against the torch formulations they replaced
(``fast_transform`` per block, and of the whole row for R4's orders p·m): the same bits, float32 and
bfloat16, in the native and the portable build, over the default model's widths, tiny blocks and
orders, strided and empty inputs; None (the caller's torch path) wherever it does not apply."""

import pytest
import torch

from lowbit.kernels.cpu import hadamard as hk
from lowbit.formats.hadamard import HadamardSizeError, dense_transform, error_bound
from lowbit.nn.online_hadamard import BlockHadamard, InputHadamard

pytestmark = pytest.mark.skipif(hk.library() is None, reason="no C compiler for the native ops")
PORTABLE = ("-O3",)
CASES = [(576, 512, 128), (1536, 1472, 64), (40, 32, 2), (64, 64, 64), (24, 16, 8), (48, 32, 16), (20, 4, 4),
         (130, 0, 128)]


def _bits(t):
    return t.view(torch.int16 if t.dtype == torch.bfloat16 else torch.int32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("flags", [None, PORTABLE], ids=["native", "portable"])
def test_same_bits_as_the_torch_transform(dtype, flags):
    lib = hk.library(flags)
    if lib is None:
        pytest.skip("build failed")
    g = torch.Generator().manual_seed(0)
    for n, normal, block in CASES:
        for tokens in (0, 1, 3, 17):
            x = (torch.randn(tokens, n, generator=g) * torch.rand(n, generator=g) * 50).to(dtype)
            got = hk.block_hadamard(x, normal, block, lib=lib)
            assert got.shape == x.shape and got.dtype == dtype
            assert torch.equal(_bits(got), _bits(hk.block_hadamard_reference(x, normal, block))), (n, normal, block, tokens)
    wide = (torch.randn(2, 5, 700, generator=g) * 9).to(dtype)
    x = wide[..., 50:626]  # 3-D, rows 700 apart: read in place
    assert torch.equal(_bits(hk.block_hadamard(x, 512, 128, lib=lib)), _bits(hk.block_hadamard_reference(x, 512, 128)))
    xt = (torch.randn(576, 3, generator=g)).to(dtype).t()  # no unit last stride: copied first
    assert torch.equal(_bits(hk.block_hadamard(xt, 512, 128, lib=lib)), _bits(hk.block_hadamard_reference(xt, 512, 128)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("flags", [None, PORTABLE], ids=["native", "portable"])
def test_gathering_in_the_same_pass_gives_the_bits_of_gathering_first(dtype, flags):
    """``perm``: the -rot presets' reorder read by the transform itself, on one thread or several
    (120 x 1536 values: over the threads' threshold)."""
    lib = hk.library(flags)
    if lib is None:
        pytest.skip("build failed")
    g = torch.Generator().manual_seed(1)
    for n, normal, block in CASES:
        perm = torch.randperm(n, generator=g)
        for tokens in (0, 1, 17, 120):
            x = (torch.randn(tokens, n, generator=g) * torch.rand(n, generator=g) * 50).to(dtype)
            got = hk.block_hadamard(x, normal, block, lib=lib, perm=perm)
            want = hk.block_hadamard_reference(x[..., perm], normal, block)
            assert torch.equal(_bits(got), _bits(want)), (n, normal, block, tokens)
    x = (torch.randn(2, 5, 700, generator=g) * 9).to(dtype)[..., 50:626]  # strided rows, read in place
    perm = torch.randperm(576, generator=g)
    assert torch.equal(_bits(hk.block_hadamard(x, 512, 128, lib=lib, perm=perm)),
                       _bits(hk.block_hadamard_reference(x[..., perm], 512, 128)))
    bad = perm.clone()
    bad[3] = 576
    with pytest.raises(ValueError, match="perm index outside"):
        hk.block_hadamard(x, 512, 128, lib=lib, perm=bad)
    with pytest.raises(ValueError, match="int64"):
        hk.block_hadamard(x, 512, 128, lib=lib, perm=perm.int())


def test_block_hadamard_module_gathers_with_its_perm():
    b = BlockHadamard(1536, 1472, 64)
    x, perm = torch.randn(9, 1536).bfloat16(), torch.randperm(1536)
    want = hk.block_hadamard_reference(x[..., perm], 1472, 64)
    assert torch.equal(_bits(b(x, perm)), _bits(want))
    assert torch.equal(_bits(b(x.half(), perm).bfloat16()), _bits(hk.block_hadamard_reference(x.half()[..., perm], 1472, 64).bfloat16()))


def test_non_finite_values_stay_where_torch_puts_them():
    x = torch.randn(3, 576)
    x[0, 5], x[1, 300], x[2, 550] = float("nan"), float("inf"), float("nan")
    for dt in (torch.float32, torch.bfloat16):
        got, want = hk.block_hadamard(x.to(dt), 512, 128), hk.block_hadamard_reference(x.to(dt), 512, 128)
        assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.isinf(), want.isinf())
        fin = want.isfinite()
        assert torch.equal(_bits(got[fin]), _bits(want[fin]))


def test_where_it_does_not_apply_the_caller_keeps_torch():
    x = torch.randn(2, 576)
    assert hk.block_hadamard(x.half(), 512, 128) is None  # float16
    assert hk.block_hadamard(x.double(), 512, 128) is None
    assert hk.block_hadamard(x, 512, 256) is None  # over the C kernel's largest block
    assert hk.block_hadamard(x, 500, 128) is None and hk.block_hadamard(x, 512, 96) is None
    assert hk.block_hadamard(x, 640, 128) is None  # more normal channels than the row has
    assert hk.block_hadamard(x.requires_grad_(), 512, 128) is None
    with torch.no_grad():
        assert hk.block_hadamard(x, 512, 128) is not None


def test_block_hadamard_module_runs_the_c_kernel_with_the_same_bits():
    b = BlockHadamard(576, 512, 128)
    x = torch.randn(4, 576).bfloat16()
    assert torch.equal(_bits(b(x)), _bits(hk.block_hadamard_reference(x, 512, 128)))
    assert torch.equal(_bits(b(x.half()).bfloat16()), _bits(hk.block_hadamard_reference(x.half(), 512, 128).bfloat16()))


ORDERS = [1536, 576, 12, 20, 24, 28, 36, 40, 64, 2, 1, 2048, 14336]  # p·m: 128·12, 16·36, ..., 512·28


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("flags", [None, PORTABLE], ids=["native", "portable"])
def test_input_hadamard_same_bits_as_the_torch_transform(dtype, flags):
    lib = hk.library(flags)
    if lib is None:
        pytest.skip("build failed")
    g = torch.Generator().manual_seed(1)
    for n in ORDERS:
        for tokens in (0, 1, 3, 9):
            x = (torch.randn(tokens, n, generator=g) * torch.rand(n, generator=g) * 50).to(dtype)
            if tokens:
                x[0, 0] = -0.0  # the sign of a zero term survives as in torch
            got = hk.input_hadamard(x, lib=lib)
            assert got.shape == x.shape and got.dtype == dtype
            assert torch.equal(_bits(got), _bits(hk.input_hadamard_reference(x))), (n, tokens)
    x = (torch.randn(2, 3, 1600, generator=g) * 9).to(dtype)[..., 10:1546]  # 3-D, rows 1600 apart
    assert torch.equal(_bits(hk.input_hadamard(x, lib=lib)), _bits(hk.input_hadamard_reference(x)))
    xt = torch.randn(576, 3, generator=g).to(dtype).t()  # no unit last stride: copied first
    assert torch.equal(_bits(hk.input_hadamard(xt, lib=lib)), _bits(hk.input_hadamard_reference(xt)))


def test_input_hadamard_within_the_bound_of_the_dense_product():
    """Bits equal to the reference, and the reference within fast_transform's stated bound of
    the exact product (so the C path is too)."""
    g = torch.Generator().manual_seed(2)
    for n in (1536, 576, 36):
        x = torch.randn(5, n, generator=g, dtype=torch.float64) * torch.logspace(-3, 3, n, dtype=torch.float64)
        exact = dense_transform(x)  # float64: far inside the float32 bound
        got = hk.input_hadamard(x.float())
        assert torch.all((got.double() - exact).abs() <= error_bound(x.float()).double())


def test_input_hadamard_non_finite_and_refusals():
    x = torch.randn(3, 1536)
    x[0, 5], x[1, 300] = float("nan"), float("inf")
    got, want = hk.input_hadamard(x), hk.input_hadamard_reference(x)
    assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.isinf(), want.isinf())
    assert hk.input_hadamard(x.half()) is None and hk.input_hadamard(x.double()) is None
    assert hk.input_hadamard(torch.zeros(3, 0)) is None
    assert hk.input_hadamard(x.clone().requires_grad_()) is None
    with pytest.raises(HadamardSizeError, match="order 52"):
        hk.input_hadamard(torch.zeros(2, 52))


def test_input_hadamard_module_runs_the_c_kernel_with_the_same_bits():
    h = InputHadamard(1536)
    x = torch.randn(4, 1536).bfloat16()
    assert torch.equal(_bits(h(x)), _bits(hk.input_hadamard_reference(x)))
    assert torch.equal(h(x.half()).view(torch.int16), hk.input_hadamard_reference(x.half()).view(torch.int16))
