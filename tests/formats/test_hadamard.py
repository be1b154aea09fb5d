"""Hadamard matrices (Sylvester ⊗ Paley) and the fast transform against the dense product."""

import math

import pytest
import torch

from lowbit.errors import LowbitError
from lowbit.formats.hadamard import (HadamardSizeError, dense_transform, error_bound, factor, fast_transform,
                                     hadamard_matrix, orthonormal, random_signs)

# orders up to 300 that need a prime-power field or another construction (refused here)
MISSING = (52, 92, 100, 116, 156, 172, 184, 188, 232, 236, 244, 260, 268, 292)
ORDERS = [1, 2] + [n for n in range(4, 301, 4) if n not in MISSING] + [576, 768, 1152, 1536, 2048]


@pytest.mark.parametrize("n", ORDERS)
def test_h_ht_is_n_identity_exactly(n):
    h = hadamard_matrix(n)
    assert h.dtype == torch.int64 and h.shape == (n, n)
    assert torch.equal(h.abs(), torch.ones_like(h))
    # in float64 (BLAS, not int64 loops): ±1 products and sums of at most n terms are exact
    hf = h.to(torch.float64)
    assert torch.equal(hf @ hf.T, n * torch.eye(n, dtype=torch.float64))


def test_every_missing_order_is_refused_and_no_other():
    refused = [n for n in range(4, 301, 4) if _refused(n)]
    assert tuple(refused) == MISSING


def _refused(n):
    try:
        factor(n)
    except HadamardSizeError:
        return True
    return False


def test_the_model_sizes_split_as_the_issue_says():
    assert factor(576) == (16, 36) and factor(1536) == (128, 12) and factor(64) == (64, 1)
    assert factor(24) == (2, 12) and factor(12) == (1, 12) and factor(20) == (1, 20) and factor(28) == (1, 28)


@pytest.mark.parametrize("n", [52, 92, 3, 6, 10, 18, 576 + 4])
def test_a_size_without_a_construction_is_a_clear_error(n):
    with pytest.raises(HadamardSizeError, match=f"order {n}"):
        hadamard_matrix(n)
    with pytest.raises(LowbitError):
        fast_transform(torch.zeros(2, n))


@pytest.mark.parametrize("bad", [0, -4, 2.0, True])
def test_a_non_order_is_refused(bad):
    with pytest.raises(HadamardSizeError):
        factor(bad)


def test_bad_tensors_are_refused():
    with pytest.raises(HadamardSizeError, match="floating-point"):
        fast_transform(torch.ones(2, 64, dtype=torch.int32))
    with pytest.raises(HadamardSizeError, match="non-empty"):
        dense_transform(torch.ones(3, 0))


@pytest.mark.parametrize("n", [1, 2, 12, 24, 36, 64, 576, 1536])
def test_fast_equals_dense_within_the_stated_bound(n):
    g = torch.Generator().manual_seed(n)
    x = torch.randn(7, n, generator=g, dtype=torch.float64) * torch.logspace(-3, 3, n, dtype=torch.float64)
    exact = x @ (hadamard_matrix(n).to(torch.float64) / math.sqrt(n))  # ±1 entries: float64 is exact here to ~1e-16
    x32 = x.float()
    fast, dense = fast_transform(x32), dense_transform(x32)
    assert fast.dtype == torch.float32 and fast.shape == x.shape
    bound = error_bound(x32).double()
    assert torch.all((fast.double() - exact).abs() <= bound)
    # the dense product: n-term sums, within n·u·‖x‖₁/√n (+ the rounding of H/√n itself)
    u = torch.finfo(torch.float32).eps / 2
    assert torch.all((dense.double() - exact).abs() <= (n + 2) * u * x.abs().sum(-1, keepdim=True) / math.sqrt(n))
    # float64 fast vs float64 dense: both far inside the float64 bound
    assert torch.all((fast_transform(x) - dense_transform(x)).abs() <= 2 * error_bound(x))


def test_fast_keeps_leading_dims_and_is_its_own_inverse_for_sylvester():
    x = torch.randn(2, 3, 5, 128, dtype=torch.float64)
    y = fast_transform(x)
    assert y.shape == x.shape
    assert torch.allclose(fast_transform(y), x, atol=1e-12)  # symmetric orthonormal: H² = I


def test_orthonormal_with_signs_is_orthogonal_and_seeded():
    s = random_signs(576, 3)
    assert torch.equal(s, random_signs(576, 3)) and not torch.equal(s, random_signs(576, 4))
    assert set(s.tolist()) == {-1, 1}
    q = orthonormal(576, signs=s)
    assert torch.allclose(q @ q.T, torch.eye(576, dtype=torch.float64), atol=1e-12)
