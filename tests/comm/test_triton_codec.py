"""The fused Triton codecs (INT8/INT4 encode, decode, decode-sum-encode) against the reference,
on CPU under the Triton interpreter (a subprocess: TRITON_INTERPRET must be set before the
kernels are decorated); on a GPU, when there is one, the compiled kernels too."""

from pathlib import Path

import pytest

from tests.triton_interpreter import run_interpreted
import torch

triton = pytest.importorskip("triton", reason="triton not installed: the Triton codecs cannot be checked here")

CASES = [f"{op}_{c}_{d}_5000{suffix}" for c in ("int8", "int4") for d in ("float32", "bfloat16", "float16")
         for op, suffix in (("encode", ""), ("decode", "_float32"), ("decode", f"_{d}"), ("reduce", ""))]


@pytest.fixture(scope="module")
def results() -> dict:
    return run_interpreted(Path(__file__).with_name("triton_checks.py"), timeout=600)


@pytest.mark.parametrize("case", sorted(set(CASES)))
def test_triton_codec_equals_reference_under_interpreter(results, case):
    assert results[case] is True


def test_every_case_ran(results):
    assert set(results) == set(CASES)


def test_dispatch_keeps_cpu_tensors_and_other_codecs_off_triton():
    from lowbit.comm.codecs import get_codec
    from lowbit.comm.codecs.device import uses_triton

    assert not uses_triton(torch.zeros(4), get_codec("int4"))
    from lowbit.comm.codecs import triton as tc

    with pytest.raises(ValueError, match="supports int8, int4"):
        tc.encode(torch.zeros(4), "fp4")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: the compiled Triton codec is not run")
@pytest.mark.parametrize("codec", ["int8", "int4"])
def test_compiled_triton_codec_on_cuda(codec):
    from triton_checks import inputs, same

    from lowbit.comm.codecs import decode_ref, encode_ref, get_codec
    from lowbit.comm.codecs.device import decode, encode, uses_triton

    c = get_codec(codec)
    x = inputs(torch.bfloat16, 5000, 3)
    assert uses_triton(x.cuda(), c)
    w = encode(x.cuda(), c)
    assert torch.equal(w.cpu(), encode_ref(x, c))
    assert same(decode(w, c, 5000, torch.bfloat16).cpu(), decode_ref(w.cpu(), c, 5000, torch.bfloat16))


@pytest.mark.parametrize("arch", [90, 80])
def test_codec_kernels_compile_for_gpus(arch):
    """The interpreter accepts programs the compiler rejects: compile every kernel and
    configuration the codec launches down to a cubin for Hopper and Ampere, here on the CPU."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from lowbit.comm.codecs import get_codec
    from lowbit.comm.codecs import triton as tc

    def build(fn, sig, consts):
        k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts), target=GPUTarget("cuda", arch, 32))
        assert k.asm.get("cubin"), f"{fn.__name__}: no cubin"

    for name in tc.SUPPORTED:
        c = get_codec(name)
        row = {"RB": c.row_bytes, "CODE_BYTES": c.code_bytes, "BITS": c.bits}
        for x in ("*fp32", "*bf16", "*fp16"):
            build(tc._encode_kernel, {"x_ptr": x, "wire_ptr": "*u8", "n": "i32", "RB": "constexpr",
                                      "CODE_BYTES": "constexpr", "BITS": "constexpr"}, row)
        for out, code in (("*fp32", 0), ("*i16", 1), ("*fp16", 2)):  # bfloat16 is written as its bits
            build(tc._decode_kernel, {"wire_ptr": "*u8", "out_ptr": out, "n": "i32", "RB": "constexpr",
                                      "CODE_BYTES": "constexpr", "BITS": "constexpr", "OUT": "constexpr"},
                  row | {"OUT": code})
        for f16 in (False, True):
            build(tc._reduce_kernel, {"wires_ptr": "*u8", "out_ptr": "*u8", "world": "i32", "rows": "i32",
                                      "clamp": "fp32", "RB": "constexpr", "CODE_BYTES": "constexpr",
                                      "BITS": "constexpr", "F16": "constexpr"}, row | {"F16": f16})
