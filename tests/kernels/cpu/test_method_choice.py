"""The shared pieces of the CPU kernel kinds: one method check, one operator probe, one native
library whose callers get a KernelError where it cannot be built."""

import pytest

from lowbit.errors import LowbitError
from lowbit.kernels.cpu import w4_gemv, w8_gemv
from lowbit.kernels.cpu.kernel_library import KernelLibrary
from lowbit.kernels.cpu.method_choice import has_aten_op, pick_method
from lowbit.kernels.linear_params import KernelError


def test_pick_method():
    assert pick_method("float", ("native", "float"), "w4a4") == "float"
    with pytest.raises(KernelError, match=r"cpu w4a4 method must be one of \('native', 'float'\), got 'fast'"):
        pick_method("fast", ("native", "float"), "w4a4")


def test_has_aten_op():
    assert has_aten_op("mm") and not has_aten_op("no_such_lowbit_op")


def test_a_library_that_does_not_build(tmp_path):
    src = tmp_path / "broken.c"
    src.write_text("this is not C;\n")
    lib = KernelLibrary("broken", str(src), lambda lib: None)  # an absolute source path stays as it is
    assert not lib.available()
    with pytest.raises(LowbitError, match="broken native kernel: no C compiler could build it"):
        lib.built()


def test_the_kernels_share_it():
    for mod in (w4_gemv, w8_gemv):
        assert isinstance(mod._LIB, KernelLibrary)
        assert mod.available() == (mod.library() is not None)
