"""Hadamard matrices and the Walsh–Hadamard transform, for rotating a model's hidden channels.

A rotation by an orthonormal Hadamard matrix spreads a few huge channels over all of them
(QuaRot), and a fast transform makes it cheap online. An order ``n`` is built as the Kronecker
product ``H_p ⊗ H_m`` of a Sylvester matrix (``p`` a power of two) and a small Paley matrix
(``m = q + 1`` for a prime ``q ≡ 3 mod 4``, or ``m = 2(q + 1)`` for a prime ``q ≡ 1 mod 4``), so
576 = 16·36 (q = 17) and 1536 = 128·12 (q = 11) work. Orders needing a prime-power field or
another construction (52, 92, ...) get :class:`HadamardSizeError`, never a silent fallback.

The transform is ``y = x @ H / √n`` on the last dimension (row vectors, as a linear's input).
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch

from lowbit.errors import LowbitError


class HadamardSizeError(LowbitError, ValueError):
    """No Hadamard matrix of this order can be built here."""


def _is_prime(q: int) -> bool:
    return q >= 2 and all(q % d for d in range(2, int(math.isqrt(q)) + 1))


def _jacobsthal(q: int) -> torch.Tensor:
    """``Q[i, j] = χ(j − i)`` with χ the quadratic character mod the prime ``q``."""
    squares = {(a * a) % q for a in range(1, q)}
    chi = torch.tensor([0] + [1 if a in squares else -1 for a in range(1, q)], dtype=torch.int64)
    idx = torch.arange(q)
    return chi[(idx[None, :] - idx[:, None]) % q]


def _paley1(q: int) -> torch.Tensor:
    """Order q + 1 (q ≡ 3 mod 4): I + the skew conference matrix [[0, 1ᵀ], [−1, Q]]."""
    c = torch.zeros(q + 1, q + 1, dtype=torch.int64)
    c[0, 1:] = 1
    c[1:, 0] = -1
    c[1:, 1:] = _jacobsthal(q)
    return c + torch.eye(q + 1, dtype=torch.int64)


def _paley2(q: int) -> torch.Tensor:
    """Order 2(q + 1) (q ≡ 1 mod 4) from the symmetric conference matrix [[0, 1ᵀ], [1, Q]]."""
    c = torch.zeros(q + 1, q + 1, dtype=torch.int64)
    c[0, 1:] = 1
    c[1:, 0] = 1
    c[1:, 1:] = _jacobsthal(q)
    a = torch.tensor([[1, 1], [1, -1]], dtype=torch.int64)
    b = torch.tensor([[1, -1], [-1, -1]], dtype=torch.int64)
    return torch.kron(c, a) + torch.kron(torch.eye(q + 1, dtype=torch.int64), b)


def _paley(m: int) -> torch.Tensor | None:
    if _is_prime(m - 1) and (m - 1) % 4 == 3:
        return _paley1(m - 1)
    if m % 2 == 0 and _is_prime(m // 2 - 1) and (m // 2 - 1) % 4 == 1:
        return _paley2(m // 2 - 1)
    return None


def _sylvester(p: int) -> torch.Tensor:
    h = torch.ones(1, 1, dtype=torch.int64)
    while h.shape[0] < p:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


@lru_cache(maxsize=None)
def factor(n: int) -> tuple[int, int]:
    """``(p, m)`` with ``n = p·m``: ``p`` the largest power of two such that a Paley matrix of
    order ``m`` exists (``m = 1``: ``n`` is a power of two)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise HadamardSizeError(f"a Hadamard order must be a positive integer, got {n!r}")
    p = n & -n
    m = n // p
    if m == 1:
        return n, 1
    while p >= 1:
        if m % 4 == 0 and _paley(m) is not None:
            return p, m
        p //= 2
        m *= 2
    raise HadamardSizeError(
        f"no Hadamard matrix of order {n} here: it needs n = 2^k · m with m = q+1 (prime q ≡ 3 mod 4) "
        f"or m = 2(q+1) (prime q ≡ 1 mod 4); e.g. 64, 576 = 16·36, 1536 = 128·12 work")


@lru_cache(maxsize=None)
def _small(m: int) -> torch.Tensor:
    return torch.ones(1, 1, dtype=torch.int64) if m == 1 else _paley(m)


def hadamard_matrix(n: int) -> torch.Tensor:
    """The ±1 matrix ``H`` of order ``n`` (int64) with ``H Hᵀ = n I``: ``H_p ⊗ H_m``."""
    p, m = factor(n)
    return torch.kron(_sylvester(p), _small(m))


def orthonormal(n: int, dtype: torch.dtype = torch.float64, signs: torch.Tensor | None = None) -> torch.Tensor:
    """``diag(signs) · H / √n`` (orthogonal); ``signs`` a ±1 vector or None."""
    h = hadamard_matrix(n).to(torch.float64) / math.sqrt(n)
    if signs is not None:
        h = signs.to(torch.float64)[:, None] * h
    return h.to(dtype)


def random_signs(n: int, seed: int) -> torch.Tensor:
    """A seeded ±1 vector (the random diagonal of a randomized Hadamard rotation)."""
    g = torch.Generator().manual_seed(int(seed))
    return torch.randint(0, 2, (n,), generator=g, dtype=torch.int64) * 2 - 1


def _check_input(x: torch.Tensor) -> int:
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise HadamardSizeError(f"the Hadamard transform needs a floating-point tensor, got "
                                f"{getattr(x, 'dtype', type(x).__name__)}")
    if x.dim() == 0 or x.shape[-1] == 0:
        raise HadamardSizeError(f"the Hadamard transform needs a non-empty last dimension, got shape {tuple(x.shape)}")
    return x.shape[-1]


def dense_transform(x: torch.Tensor) -> torch.Tensor:
    """Reference: ``x @ H / √n`` as one dense matrix product in ``x``'s dtype."""
    n = _check_input(x)
    return x @ orthonormal(n, x.dtype).to(x.device)


def _small_factor(y: torch.Tensor, m: int) -> torch.Tensor:
    """``y @ H_m`` on the last dimension. Below float64 as an ordered sum (row 0's term, then + row
    d's term for d = 1 .. m-1; the ±1 products are exact), not a matrix product whose summation
    order is the BLAS's: the C and Triton online transforms add in this order and so give these
    bits. float64 (the offline rotation of weights, which no kernel repeats) keeps the product: 7x
    faster on the default model's embedding."""
    h = _small(m).to(dtype=y.dtype, device=y.device)
    if y.dtype == torch.float64:
        return y @ h
    acc = y[..., 0:1] * h[0]
    for d in range(1, m):
        acc = acc + y[..., d:d + 1] * h[d]
    return acc


def fast_transform(x: torch.Tensor) -> torch.Tensor:
    """``x @ H / √n`` in O(n (log p + m)): a butterfly over the power-of-two factor, then the
    small dense factor. Equal to :func:`dense_transform` up to rounding; per output element
    ``|ŷ − y| ≤ (log2 p + m + 2) · u · ‖x‖₁ / √n`` (u the unit roundoff: ``log2 p`` rounded
    additions, an m-term dot product and one scaling, each term of magnitude ``|x_i|/√n``)."""
    n = _check_input(x)
    p, m = factor(n)
    shape = x.shape
    y = x.reshape(-1, p, m)
    if m > 1:
        y = _small_factor(y, m)
    h = 1
    while h < p:
        y = y.reshape(-1, p // (2 * h), 2, h, m)
        a, b = y[:, :, 0], y[:, :, 1]
        y = torch.stack((a + b, a - b), dim=2)
        h *= 2
    return (y.reshape(shape) * (1.0 / math.sqrt(n))).to(x.dtype)


def error_bound(x: torch.Tensor) -> torch.Tensor:
    """The bound of :func:`fast_transform`'s docstring, per row of ``x`` (same for every output)."""
    n = x.shape[-1]
    p, m = factor(n)
    u = torch.finfo(x.dtype).eps / 2
    return (math.log2(p) + m + 2) * u * x.abs().sum(-1, keepdim=True) / math.sqrt(n)
