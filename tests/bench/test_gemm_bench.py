"""``lowbit bench gemm``: shape parsing, roofline arithmetic, and a tiny end-to-end run."""

import json

import pytest
import torch

from lowbit.bench.gemm import _finish, interleaved_medians, parse_shapes, tensor_bytes
from lowbit.cli import main
from lowbit.kernels import from_float
from lowbit.kernels.cpu import w4a4, w4a16


def test_parse_shapes():
    assert parse_shapes("256x64") == [("256x64", 256, 64)]
    assert [s[1:] for s in parse_shapes("llama7b")] == [(4096, 4096), (4096, 11008), (11008, 4096)]
    for bad in ("", "12xq", "0x5", "gpt5"):
        with pytest.raises(ValueError):
            parse_shapes(bad)


def test_roofline_and_speedups():
    rows = [{"shape": "s", "batch": 1, "kernel": k, "ms": ms, "bytes": b, "ops": 2e6}
            for k, ms, b in [("fp32", 4.0, 4e6), ("bf16", 2.0, 2e6), ("w4a16", 1.0, 0.5e6)]]
    _finish(rows, copy_bw=1e9)  # 1 GB/s; peak = 2e6 ops / 2 ms = 1e9 op/s
    w4 = rows[2]
    assert w4["x_vs_bf16"] == pytest.approx(2.0) and w4["x_vs_fp32"] == pytest.approx(4.0)
    assert w4["roofline_ms"] == pytest.approx(2.0)  # compute: 2e6 / 1e9 s > 0.5e6 B / 1e9 B/s
    assert w4["bound_by"] == "compute" and w4["of_roofline"] == pytest.approx(2.0)
    assert rows[0]["bound_by"] == "memory" and rows[0]["roofline_ms"] == pytest.approx(4.0)


def test_kernels_are_timed_in_turn_within_each_repeat():
    """A machine whose speed drifts during the run must shift every row alike: after one warm-up
    call each, the repeats go a, b, c, a, b, c, ...; a callable slower than max_seconds runs once."""
    import time

    calls = []
    fns = {k: (lambda k=k: calls.append(k)) for k in "abc"}
    fns["slow"] = lambda: (calls.append("slow"), time.sleep(0.02))
    got = interleaved_medians(fns, 3, lambda: None, max_seconds=0.01)
    assert calls[:4] == ["a", "b", "c", "slow"]  # warm-ups
    assert calls[4:] == ["a", "b", "c", "slow", "a", "b", "c", "a", "b", "c"]
    assert {k: n for k, (_, n) in got.items()} == {"a": 3, "b": 3, "c": 3, "slow": 1}
    assert got["slow"][0] >= 0.02 > got["a"][0]


def test_tensor_bytes_counts_dataclass_tensors():
    import torch

    from lowbit.kernels.cpu import w4a16
    from lowbit.kernels import from_float

    p = from_float(torch.randn(32, 256), "w4a16")
    st = w4a16.prepare(p, "int4pack")
    assert tensor_bytes(st) == 32 * 256 // 2 + 2 * 32 * 2 * 2  # int4 nibbles + [groups, out, 2] bf16
    st = w4a16.prepare(p, "native")
    assert tensor_bytes(st) == 32 * 256 // 2 + 2 * 32 * 2 * 4  # int4 nibbles + fp32 scale, scale * zero


def test_gemm_end_to_end(tmp_path):
    out = tmp_path / "g"
    rc = main(["bench", "gemm", "--shapes", "256x48", "--batches", "1,3", "--kernels", "fp32,bf16,w4a16,w4a16@int4pack,w8a8,w4a4,w4a4@int_mm",
               "--repeats", "1", "--threads", "1", "--out", str(out)])
    assert rc == 0
    data = json.loads((out / "gemm.json").read_text())
    rows = data["rows"]
    assert len(rows) == 14 and (out / "gemm.png").stat().st_size > 0 and (out / "gemm.csv").exists()
    w4 = from_float(torch.zeros(48, 256), "w4a4", group=128)
    assert {r["impl"] for r in rows if r["kernel"].startswith("w4a4")} == {f"cpu:{w4a4.default_method(w4)}", "cpu:int_mm"}
    w4 = from_float(torch.zeros(48, 256), "w4a16", group=128)
    assert {r["impl"] for r in rows if r["kernel"].startswith("w4a16")} == {f"cpu:{w4a16.default_method(w4)}",
                                                                            "cpu:int4pack"}
    for r in rows:
        assert r["ms"] > 0 and r["roofline_ms"] > 0 and r["x_vs_bf16"] > 0
        floats = {f["kernel"]: f["ms"] for f in rows if f["shape"] == r["shape"] and f["batch"] == r["batch"]
                  and f["kernel"] in ("fp32", "bf16")}
        assert r["best_float"] == min(floats, key=floats.get)
        assert r["x_vs_best_float"] == pytest.approx(min(floats.values()) / r["ms"])
        assert r["weight_bytes"] > 0 and r["bytes"] > r["weight_bytes"]
    assert data["meta"]["machine"]["cpu"]["features"]


def test_gemm_always_measures_both_floats(tmp_path):
    assert main(["bench", "gemm", "--shapes", "64x16", "--batches", "1", "--kernels", "w8a8", "--repeats", "1",
                 "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "gemm.json").read_text())["rows"]
    assert [r["kernel"] for r in rows] == ["fp32", "bf16", "w8a8"]


def test_gemm_back_to_back_times_runs_of_calls(tmp_path, monkeypatch):
    """--back-to-back times each kernel as a loop of calls (the GPUs' way) and says so in the meta."""
    from lowbit.bench import gemm

    seen = []
    real = gemm.interleaved_medians
    def recording(fns, *a, **k):  # the kernels' timing (the copy-bandwidth probe passes amortize by position)
        if "amortize" in k:
            seen.append(k["amortize"])
        return real(fns, *a, **k)

    monkeypatch.setattr(gemm, "interleaved_medians", recording)
    for flag, want in (([], False), (["--back-to-back"], True)):
        out = tmp_path / str(want)
        assert main(["bench", "gemm", "--shapes", "64x16", "--batches", "1", "--kernels", "w8a8", "--repeats", "1",
                     *flag, "--out", str(out)]) == 0
        assert seen[-1] is want
        assert json.loads((out / "gemm.json").read_text())["meta"]["back_to_back"] is want


def test_gemm_bad_arguments(tmp_path):
    assert main(["bench", "gemm", "--kernels", "w9a9", "--out", str(tmp_path)]) == 2
    assert main(["bench", "gemm", "--kernels", "w8a8@int4pack", "--out", str(tmp_path)]) == 2
    assert main(["bench", "gemm", "--shapes", "huge", "--out", str(tmp_path)]) == 2


def test_weight_copies_overflow_the_last_level_cache():
    """Repeated calls must stream weights from memory (as decode does), not from L3."""
    import torch

    from lowbit.bench.gemm import _copies, _last_level_cache

    cpu = torch.device("cpu")
    llc = _last_level_cache(cpu)
    assert llc > 0
    for wbytes in (1 << 20, 8 << 20, 64 << 20):
        n = _copies(cpu, wbytes)
        assert 1 <= n <= 16 and (n == 16 or n * wbytes >= 4 * llc)
    assert _copies(cpu, 1 << 40) == 1
