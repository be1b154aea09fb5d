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
