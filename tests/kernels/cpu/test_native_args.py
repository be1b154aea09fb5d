"""What the native kernels check before C reads a pointer: prepared weights that cache raw pointers
rebuild them after torch.save / torch.load and deep copies (the saved ints pointed into the old
process's or the original's memory: a segfault or a use-after-free), tensors that are not in CPU
memory are refused (a meta tensor's data_ptr() reached the C), and another kernel's prepared
weights are refused (their sizes were read as this kernel's)."""

import copy
import gc
import io

import pytest
import torch

from lowbit.kernels import from_float, prepare
from lowbit.kernels.cpu import a16_gemm, i8_gemm, w4_gemv, w4a4, w4a16, w8_gemv, w8a16
from lowbit.kernels.linear_params import KernelError

pytestmark = pytest.mark.skipif(not (w4_gemv.available() and w8_gemv.available() and i8_gemm.available()
                                     and a16_gemm.available()), reason="no C compiler for the native kernels")

CACHED = [("w4a16", "native"), ("w4a16", "gemm"), ("w8a16", "native"), ("w8a16", "gemm"), ("w8a8", "gemm"),
          ("w8a8", "native"), ("w4a4", "gemm"), ("w4a4", "native")]


_FIRST = {"W8GemvPrepared": lambda s: s.packed, "W4GemvPrepared": lambda s: s.packed, "A16Panels": lambda s: s.panels,
          "W8A8NativePrepared": lambda s: s.weight.panels, "W4A4GemmPrepared": lambda s: s.normal.panels}


def _caches(st) -> list:
    """(cached args, the tensor its first pointer must be) of every pointer cache in ``st``."""
    name = type(st).__name__
    if name == "W4A4NativePrepared":
        return _caches(st.normal) + (_caches(st.outlier_native) if st.outlier_native is not None else [])
    if name == "W8A8NativePrepared" and st.method != "gemm":
        return _caches(st.weight)
    return [(st.args, _FIRST[name](st))]


@pytest.mark.parametrize("kind,method", CACHED)
def test_prepared_weights_survive_torch_save_and_deep_copy(kind, method):
    torch.manual_seed(1)
    k = 16 if kind == "w4a4" else 0
    pl = prepare(from_float(torch.randn(40, 256 + k), kind, n_outliers=k, bias=torch.randn(40)), cpu_method=method)
    x = torch.randn(3, 256 + k)
    expect = pl.batched(x)
    buf = io.BytesIO()
    torch.save(pl, buf)
    twin = copy.deepcopy(pl)
    del pl
    gc.collect()
    junk = [torch.full((1 << 16,), 7, dtype=torch.uint8) for _ in range(32)]  # reuse the freed memory
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    for got in (loaded, twin):
        assert all(args[0] == t.data_ptr() for args, t in _caches(got.state))
        assert torch.equal(got.batched(x), expect)
        assert torch.equal(got(x), expect)
    del junk


def test_states_on_other_devices_are_refused_when_built():
    pl = prepare(from_float(torch.randn(16, 128), "w4a16"), cpu_method="gemm")
    buf = io.BytesIO()
    torch.save(pl, buf)
    buf.seek(0)
    with pytest.raises(ValueError, match="CPU tensors"):
        torch.load(buf, weights_only=False, map_location="meta")
    with pytest.raises(ValueError, match="CPU tensors"):
        w8_gemv.W8GemvPrepared(torch.zeros(4, 32, dtype=torch.int8, device="meta"), torch.ones(4), 32, 32, 4)


def _meta_cases():
    meta = lambda *shape, dtype=torch.float32: torch.zeros(*shape, dtype=dtype, device="meta")  # noqa: E731
    w8 = w8_gemv.prepare(torch.randint(-127, 127, (8, 64), dtype=torch.int8), torch.rand(8))
    w4 = prepare(from_float(torch.randn(8, 128), "w4a16"), cpu_method="native").state
    a16 = prepare(from_float(torch.randn(16, 128), "w4a16"), cpu_method="gemm").state
    p4 = i8_gemm.pack(torch.randint(-7, 7, (16, 64)), torch.rand(16, 1), 4, 64, 64)
    gemm = prepare(from_float(torch.randn(16, 128), "w4a4"), cpu_method="gemm")

    def codes_on_meta():
        c = i8_gemm.act_codes(torch.randn(2, 64), 0, p4, 4, 1.0)
        c.xq = c.xq.to("meta")
        i8_gemm.run_codes(c, p4)

    return {
        "w8 act codes": lambda: w8_gemv.act_codes(meta(2, 64), w8, 8, 1.0),
        "w8a8 native batched": lambda: prepare(from_float(torch.randn(8, 64), "w8a8"),
                                               cpu_method="native").batched(meta(2, 64)),
        "w4a4 native call": lambda: prepare(from_float(torch.randn(8, 128), "w4a4"), cpu_method="native")(meta(2, 128)),
        "w4 quantize_and_run": lambda: w4_gemv.quantize_and_run(meta(2, 128), w4, 0, 4, 1.0),
        "i8 act codes": lambda: i8_gemm.act_codes(meta(2, 64), 0, p4, 4, 1.0),
        "w8 run_codes scale": lambda: w8_gemv.run_codes(torch.ones(2, 64, dtype=torch.int8), meta(2), w8),
        "w8 int16 codes": lambda: w8_gemv.run_int16_codes(meta(2, 64, dtype=torch.int16), torch.rand(2), w8),
        "w4 run_codes scale": lambda: w4_gemv.run_codes(torch.ones(2, 128, dtype=torch.int16), meta(2, 1), w4),
        "w8 rescale product": lambda: w8_gemv.rescale(meta(2, 8, dtype=torch.int32), torch.rand(2, 1), w8),
        "w8 rescale scales": lambda: w8_gemv.rescale(torch.ones(2, 8, dtype=torch.int32), meta(2, 1), w8),
        "round_bf16": lambda: i8_gemm.round_bf16(meta(1000)),
        "i8 run_codes codes": codes_on_meta,
        "i8 linear perm": lambda: w4a4.run_gemm(torch.randn(2, 128), gemm.state,
                                                perm=torch.arange(128, device="meta")),
        "dequantize_bf16 out": lambda: a16_gemm.dequantize_bf16(a16, out=meta(16, 128, dtype=torch.bfloat16)),
    }


@pytest.mark.parametrize("case", list(_meta_cases()))
def test_tensors_outside_cpu_memory_are_refused(case):
    """Each once handed a meta tensor's data_ptr() (0, as a CUDA pointer is no CPU memory) to the C:
    a segfault, or for the permutation silently no permutation."""
    with pytest.raises(ValueError, match="CPU"):
        _meta_cases()[case]()


def test_another_kernels_weights_are_refused():
    """w8_gemv.run_codes on 4-bit weights returned a wrong-shaped result; the run functions read the
    other layout's pointers and sizes."""
    w4 = prepare(from_float(torch.randn(8, 128), "w4a16"), cpu_method="native").state
    w8 = prepare(from_float(torch.randn(8, 128), "w8a16"), cpu_method="native").state
    a16 = prepare(from_float(torch.randn(16, 128), "w4a16"), cpu_method="gemm").state
    x = torch.randn(2, 128)
    cases = [lambda: w8_gemv.run(x, w4), lambda: w8_gemv.run(x, a16), lambda: w4_gemv.run(x, a16),
             lambda: w4_gemv.run(x, w8), lambda: a16_gemm.run(x, w4), lambda: a16_gemm.dequantize_bf16(w8),
             lambda: w8_gemv.run_codes(torch.ones(2, 128, dtype=torch.int8), torch.ones(2), w4),
             lambda: w4_gemv.run_codes(torch.ones(2, 128, dtype=torch.int8), torch.ones(2, 1), w8),
             lambda: w8_gemv.act_codes(x, w4, 8, 1.0), lambda: i8_gemm.act_codes(x, 0, a16, 4, 1.0),
             lambda: w4a16.run(x, w8), lambda: w8a16.run(x, w4)]
    for i, case in enumerate(cases):
        with pytest.raises(KernelError, match="weights"):
            case()
            pytest.fail(f"case {i}")
