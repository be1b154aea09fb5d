"""Compile the Triton kernels for real GPU targets (Hopper sm_90, Ampere sm_80) on this CPU-only
machine: the interpreter accepts programs the compiler rejects (a variable whose shape differs
between the branches of an if/else once shipped that way and failed on an H200), so CI checks that
every kernel and configuration we launch really compiles down to a cubin."""

import pytest

triton = pytest.importorskip("triton")

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from lowbit.kernels.triton import act_codes as triton_act_quant, w4a4 as triton_w4a4  # noqa: E402

ACT_SIG = {"x_ptr": "*fp32", "perm_ptr": "*i64", "c_ptr": "*i8", "s_ptr": "*fp32", "oc_ptr": "*i8", "os_ptr": "*fp32",
           "N": "i32", "K": "i32", "NG": "i32", "s_x": "i32", "s_c": "i32", "s_s": "i32", "s_oc": "i32", "clip": "fp32",
           "G": "constexpr", "KB": "constexpr", "QMIN": "constexpr", "QMAX": "constexpr", "HAS_PERM": "constexpr",
           "HALF": "constexpr"}
GEMM_SIG = {"a_ptr": "*i8", "as_ptr": "*fp32", "ao_ptr": "*i8", "aos_ptr": "*fp32", "w_ptr": "*u8", "ws_ptr": "*fp32",
            "wo_ptr": "*i8", "wos_ptr": "*fp32", "b_ptr": "*fp32", "y_ptr": "*fp32", "M": "i32", "O": "i32", "N": "i32",
            "K": "i32", "NG": "i32", "s_a": "i32", "s_as": "i32", "s_ao": "i32", "s_w": "i32", "s_ws": "i32", "s_wo": "i32",
            "s_y": "i32", "G": "constexpr", "BM": "constexpr", "BO": "constexpr", "BK": "constexpr", "HAS_BIAS": "constexpr"}


def _compile(fn, sig, consts, arch):
    k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts), target=GPUTarget("cuda", arch, 32))
    assert k.asm.get("cubin"), "no cubin produced"


@pytest.mark.parametrize("arch", [90, 80])
def test_act_quant_kernel_compiles(arch):
    for half in (False, True):
        _compile(triton_act_quant._act_quant_kernel, ACT_SIG,
                 {"G": 128, "KB": 64, "QMIN": -8.0, "QMAX": 7.0, "HAS_PERM": True, "HALF": half}, arch)


@pytest.mark.parametrize("arch", [90, 80])
def test_w4a4_gemm_kernel_compiles(arch):
    for cfg in triton_w4a4.CONFIGS:
        _compile(triton_w4a4._w4a4_kernel, GEMM_SIG, {"G": 128, "BK": 32, "HAS_BIAS": True, "BM": cfg[0], "BO": cfg[1]}, arch)


HAD_SIG = {"x_ptr": "*fp32", "y_ptr": "*fp32", "s_x": "i32", "n": "i32", "normal": "i32", "scale": "fp32",
           "B": "constexpr", "LOG2B": "constexpr", "TAIL": "constexpr", "BF16": "constexpr"}


@pytest.mark.parametrize("arch", [90, 80])
def test_block_hadamard_kernel_compiles(arch):
    from lowbit.kernels.triton import hadamard as triton_hadamard

    for block, ptr, bf16 in ((128, "*fp32", False), (64, "*i16", True), (2, "*fp16", False)):
        sig = dict(HAD_SIG, x_ptr=ptr, y_ptr=ptr)
        _compile(triton_hadamard._block_hadamard_kernel, sig, {"B": block, "LOG2B": block.bit_length() - 1, "TAIL": 64, "BF16": bf16}, arch)


IN_SIG = {"x_ptr": "*fp32", "y_ptr": "*fp32", "h_ptr": "*fp32", "s_x": "i32", "n": "i32", "scale": "fp32",
          "P": "constexpr", "M": "constexpr", "MP": "constexpr", "LOG2P": "constexpr", "BF16": "constexpr"}


@pytest.mark.parametrize("arch", [90, 80])
def test_input_hadamard_kernel_compiles(arch):
    from lowbit.kernels.triton import hadamard as triton_hadamard

    for p, m, mp, ptr, bf16 in ((128, 12, 16, "*fp32", False), (16, 36, 64, "*i16", True), (64, 1, 1, "*fp16", False),
                                (512, 28, 32, "*fp32", False)):
        sig = dict(IN_SIG, x_ptr=ptr, y_ptr=ptr)
        _compile(triton_hadamard._input_hadamard_kernel, sig,
                 {"P": p, "M": m, "MP": mp, "LOG2P": p.bit_length() - 1, "BF16": bf16}, arch)
