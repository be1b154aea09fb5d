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


@pytest.mark.parametrize("cap,refused", [("AVX2", True), ("avx512_core", True), ("AVX512_CORE_VNNI", False),
                                         ("", False)])
def test_int_mm_is_refused_where_onednn_is_capped_below_vnni(cap, refused, monkeypatch):
    """On a VNNI CPU torch gives _int_mm to oneDNN, whose int8 kernels below VNNI saturate: under
    such a cap the int_mm method is refused with the reason, and W8A8's GEMV does not hand batches
    to it; on a CPU without VNNI (torch's own exact loop) nothing is refused."""
    import torch

    from lowbit.kernels import from_float
    from lowbit.kernels.cpu import method_choice, w4a4, w8a8

    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
    for features, vnni in (({"avx512_vnni": True, "amx_int8": True}, True), ({"avx2": True}, False)):
        monkeypatch.setattr(method_choice, "cpu_info", lambda f=features: {"features": f})
        monkeypatch.setattr(w8a8, "cpu_info", lambda f=features: {"features": f})
        bad = refused and vnni
        assert (method_choice.int_mm_exact() is not None) == bad
        assert w8a8.int_mm_for_batches() == (vnni and not bad)
        for kind, mod in (("w8a8", w8a8), ("w4a4", w4a4)):
            p = from_float(torch.randn(16, 128), kind, **({"n_outliers": 8} if kind == "w4a4" else {}))
            if bad:
                with pytest.raises(KernelError, match="ONEDNN_MAX_CPU_ISA"):
                    mod.prepare(p, "int_mm")
            else:
                assert mod.prepare(p, "int_mm").method == "int_mm"
