"""``lowbit env``: the CPU, the native libraries and the kernel each kind runs, as JSON; a bad
``LOWBIT_ISA`` override is one error line."""

import json
import os

from lowbit.cli import main


def test_env_reports_cpu_libraries_and_kernels(tmp_path, capsys):
    assert main(["env", "--json", str(tmp_path / "env.json")]) == 0
    rep = json.loads((tmp_path / "env.json").read_text())
    out = capsys.readouterr().out
    assert rep["cpu"]["model"] in out
    assert {lib["name"] for lib in rep["native"]} == {"all-reduce codecs", "4-bit linear", "8-bit linear", "decode ops",
                                                      "packed KV cache", "batched int8 linear", "batched A16 linear",
                                                      "online block Hadamard"}
    assert set(rep["kernels"]) == {"w4a16", "w8a16", "w8a8", "w4a4"}
    i8 = next(lib["built"] for lib in rep["native"] if lib["name"] == "batched int8 linear")
    # the suite runs with any setting; auto unless another is asked for
    expect = os.environ.get("LOWBIT_THREADS") if os.environ.get("LOWBIT_THREADS") in ("omp", "pool") else "auto"
    assert rep["kernel_threads"] == (expect if i8 else None)
    # a kind runs a native kernel (the GEMV or the batched one) exactly where its library built
    w4 = next(lib["built"] for lib in rep["native"] if lib["name"] == "4-bit linear")
    assert (rep["kernels"]["w4a16"] in ("cpu:native", "cpu:gemm")) == w4
    # what many-token bf16 calls run on, by the same functions that choose it
    from lowbit.kernels.cpu import a16_gemm

    for kind, nibbles in (("w4a16", True), ("w8a16", False)):
        path = rep["bf16_calls"][kind]
        assert path == a16_gemm.bf16_calls(nibbles) and path in " ".join(out.split())  # rich wraps long lines
        if a16_gemm.dpbf16():
            assert path == f"AVX512_BF16 dot products from {a16_gemm.DPBF16_TOKENS[nibbles]} tokens"
    from lowbit.kernels.cpu import huge_pages

    assert rep["huge_pages"] == {"thp": huge_pages.thp_mode(), "weights": huge_pages.enabled()}
    assert f"transparent huge pages: {huge_pages.thp_mode()}" in out


def test_a_bad_override_is_one_cli_line(monkeypatch, capsys):
    from lowbit.cli import main

    monkeypatch.setenv("LOWBIT_ISA", "avx9")
    assert main(["env"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("lowbit: error: LOWBIT_ISA='avx9' is not a variant") and err.count("\n") == 1


def test_env_names_w8a8s_wide_layer_kernel_where_it_differs(monkeypatch):
    """On AVX2 builds W8A8 runs the batched kernel only from GEMM_MIN_IN_AVX2 inputs; the report
    says so instead of naming the narrow layers' kernel alone."""
    from lowbit.bench import machine
    from lowbit.kernels.cpu import i8_gemm, w8a8

    if not i8_gemm.available():
        import pytest

        pytest.skip("no C compiler for the batched int8 kernel")
    monkeypatch.setattr(i8_gemm, "simd", lambda lib=None: 256)
    assert machine.report()["kernels"]["w8a8"] == f"cpu:native; cpu:gemm from {w8a8.GEMM_MIN_IN_AVX2} inputs"
    monkeypatch.setattr(i8_gemm, "simd", lambda lib=None: 513)
    assert machine.report()["kernels"]["w8a8"] == "cpu:gemm"
