"""Triton kernels checked on CPU under the Triton interpreter (a subprocess, because
TRITON_INTERPRET must be set before the kernels are decorated)."""

from pathlib import Path

import pytest

from tests.triton_interpreter import run_interpreted

triton = pytest.importorskip("triton", reason="triton not installed: Triton kernels cannot be checked here")


@pytest.fixture(scope="module")
def results() -> dict:
    return run_interpreted(Path(__file__).with_name("checks.py"), timeout=240)


@pytest.mark.parametrize("case", ["k32", "k0_m17", "g64_odd"])
def test_act_quant_with_reorder_equals_reference(results, case):
    assert results[f"act_{case}"] is True


@pytest.mark.parametrize("case", ["k32", "k0_m17", "g64_odd"])
def test_w4a4_gemm_within_fp32_rescale_bound(results, case):
    assert results[f"gemm_{case}"] is True, results[f"gemm_{case}_maxrel"]


def test_int8_per_token_row_equals_reference(results):
    assert results["act_int8_row"] is True


@pytest.mark.parametrize("case", ["int8_row", "int4_g64"])
def test_compressed_tensors_scale_rule_equals_reference(results, case):
    assert results[f"act_ct_{case}"] is True


@pytest.mark.parametrize("case", ["576", "bf16", "tiny", "notail"])
def test_block_hadamard_same_bits_as_torch(results, case):
    """The rotated presets' online transform on CUDA tensors: the torch path's bits."""
    assert results[f"had_{case}"] is True


@pytest.mark.parametrize("case", ["1536", "576_bf16", "12_fp16", "64", "20"])
def test_input_hadamard_same_bits_as_torch(results, case):
    """R4's whole-input transform (orders p·m) on CUDA tensors: the torch path's bits."""
    assert results[f"in_{case}"] is True
