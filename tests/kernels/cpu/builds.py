"""The portable build of a native library, which every faster build is compared with bit for bit."""

import pytest


def portable_build(library, flags):
    """``library(flags)``, or skip the test where that build fails."""
    lib = library(flags)
    if lib is None:
        pytest.skip("portable build failed")
    return lib
