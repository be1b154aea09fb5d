"""The portable build of a native library, which every faster build is compared with bit for bit."""

import pytest


def portable_build(library, flags):
    """``library(flags)``, or skip the test where that build fails."""
    lib = library(flags)
    if lib is None:
        pytest.skip("portable build failed")
    return lib


def amx_builds(library):
    """The default build (None), and where this CPU runs the ``amx`` variant one with its tiles from
    1 token on (``-DAMX_MIN_TOKENS=1``), so that every batch of a test reaches them."""
    from lowbit.native import isa

    libs = [None]
    if isa.runnable(isa.BY_NAME["amx"]):
        libs.append(library(("-O3", *isa.BY_NAME["amx"].flags, "-pthread", "-DAMX_MIN_TOKENS=1")))
    return libs


def variant_flags(variant, extra=("-pthread",), opt="-O3"):
    """The compiler flags of an ISA variant's build (``lowbit.native.isa.VARIANTS``)."""
    return (opt, *variant.flags, *extra)


def variant_builds(library, names=("avx2", "avx512")):
    """The builds of the ISA variants ``names`` that this CPU runs (paths the widest build skips:
    the narrower vectors, the products without VNNI)."""
    from lowbit.native import isa

    return [library(variant_flags(isa.BY_NAME[n])) for n in names if isa.runnable(isa.BY_NAME[n])]


def bf16_edge_values():
    """float32 values at bfloat16's rounding edges: exact ties to even and odd, one ulp beside them,
    the largest finite values that round to Inf, signed zeros, subnormals, Inf, NaNs with payloads."""
    import torch

    bits = [0x3F808000, 0x3F818000, 0x3F808001, 0x3F807FFF, 0x7F7FFFFF, 0x7F7F7FFF, 0x7F7F8000, 0xFF7FFFFF,
            0x00000000, 0x80000000, 0x00000001, 0x00008000, 0x00018000, 0x807FFFFF, 0x7F800000, 0xFF800000,
            0x7FC00000, 0x7F800001, 0xFFFFFFFF, 0x7FBFFFFF, 0x3F800000, 0xBF80C000]
    v = torch.tensor([b - (1 << 32) if b >= 1 << 31 else b for b in bits], dtype=torch.int32).view(torch.float32)
    return torch.cat([v, torch.randn(37) * 1e3])  # 59 values: vector bodies and a scalar tail
