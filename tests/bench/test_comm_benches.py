"""The all-reduce benchmarks and the tuner: argument parsing, summaries, and tiny end-to-end runs."""

import json

import pytest

from lowbit.bench.allreduce import parse_sizes, summarize
from lowbit.cli import main
from lowbit.bench import netns


def test_parse_sizes():
    assert parse_sizes("4K..64K") == [4096, 16384, 65536]
    assert parse_sizes("4K..16K", factor=2) == [4096, 8192, 16384]
    assert parse_sizes("1K,3M") == [1024, 3 << 20]
    with pytest.raises(ValueError):
        parse_sizes("64K..4K")


def test_summarize_speedup_and_crossover():
    rows = [
        {"size_bytes": s, "method": m, "seconds": t, "sqnr_db": 0.0}
        for s, m, t in [(1, "plain", 1.0), (1, "int4", 2.0), (2, "plain", 2.0), (2, "int4", 1.0), (4, "plain", 4.0), (4, "int4", 2.0)]
    ]
    out, cross = summarize(rows, world=2)
    assert [r["speedup"] for r in out if r["method"] == "int4"] == [0.5, 2.0, 2.0]
    assert cross == {"int4": 2}
    assert out[0]["busbw_GBps"] == pytest.approx(1 / 1.0 / 1e9)


def test_link_shaping_errors(monkeypatch):
    with pytest.raises(ValueError):
        netns.tc_args(0)
    assert netns.tc_args(2)[:3] == ["tbf", "rate", "2gbit"]
    monkeypatch.setattr(netns.os, "geteuid", lambda: 1000)
    with pytest.raises(netns.NetnsError, match="needs root"):
        netns.check_can_shape()
    monkeypatch.setattr(netns.os, "geteuid", lambda: 0)
    monkeypatch.setattr(netns.shutil, "which", lambda tool: None)
    with pytest.raises(netns.NetnsError, match="iproute2"):
        netns.check_can_shape()


def test_bench_allreduce_end_to_end(tmp_path):
    assert main(["bench", "allreduce", "--world-size", "2", "--codecs", "int4,fp", "--sizes", "8K,64K",
                 "--repeats", "1", "--serial", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "allreduce.json").read_text())
    assert {r["method"] for r in data["rows"]} == {"plain", "int4", "fp", "int4 serial", "fp serial"}
    by = {(r["size_bytes"], r["method"]): r["sqnr_db"] for r in data["rows"]}
    assert all(by[(s, "int4")] == by[(s, "int4 serial")] for s in (8192, 65536))  # pipelining changes no bit
    assert (tmp_path / "allreduce.csv").read_text().startswith("size_bytes,method")
    assert (tmp_path / "allreduce_speedup.png").stat().st_size > 1000
    int4 = [r for r in data["rows"] if r["method"] == "int4"]
    assert all(10 < r["sqnr_db"] < 40 for r in int4)


def test_bench_codecs_end_to_end(tmp_path):
    assert main(["bench", "codecs", "--elements", "65536", "--repeats", "2", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "codecs.json").read_text())["rows"]
    assert [r["codec"] for r in rows] == ["fp", "int8", "int6", "int4", "int3", "fp4"]
    assert all(r["encode_GBps"] > 0 and r["copy_GBps"] > 0 for r in rows)


def test_benches_take_codec_options(tmp_path):
    """int4+h+o16 in bench codecs (one-shot encode/decode) and bench allreduce (whole tokens of --hidden)."""
    assert main(["bench", "codecs", "--elements", "65536", "--repeats", "2", "--codecs", "int4,int4+h+o16",
                 "--hidden", "576", "--out", str(tmp_path / "c")]) == 0
    rows = json.loads((tmp_path / "c" / "codecs.json").read_text())["rows"]
    assert [r["codec"] for r in rows] == ["int4", "int4+h+o16"]
    assert rows[1]["wire_ratio"] == pytest.approx(16 / (4.5 + 16 * 16 / 576), abs=1e-3) and rows[1]["encode_GBps"] > 0
    assert main(["bench", "allreduce", "--world-size", "2", "--codecs", "int4+o16,INT4+o16+h", "--sizes", "64K",
                 "--repeats", "1", "--accuracy-elements", "4096", "--out", str(tmp_path / "a")]) == 0
    data = json.loads((tmp_path / "a" / "allreduce.json").read_text())
    assert {r["method"] for r in data["rows"]} == {"plain", "int4+o16", "int4+h+o16"}
    assert {r["size_bytes"] for r in data["rows"]} == {65536 // 2 // 576 * 576 * 2}  # whole tokens
    assert data["accuracy"] == []  # options act on hidden-size messages: their accuracy is the TP table's


def test_tune_writes_a_table_that_quick_all_reduce_reads(tmp_path, monkeypatch):
    path = tmp_path / "qr.json"
    assert main(["tune", "allreduce", "--world-sizes", "2", "--codecs", "int4", "--dtypes", "bfloat16",
                 "--sizes", "16K..256K", "--codec-elements", "65536", "--repeats", "2", "--out", str(path)]) == 0
    from lowbit.comm.policy import SizePolicy, load_table

    monkeypatch.delenv("LOWBIT_QR_MIN_BYTES", raising=False)
    monkeypatch.delenv("LOWBIT_QR_MAX_BYTES", raising=False)
    entries = load_table(path)
    e = entries["int4/w2/bfloat16"]
    assert e["min_bytes"] >= 0 and e["alpha_s"] >= 0 and e["bus_bytes_per_s"] > 0
    assert set(e["paths"]) == {"plain", "oneshot", "twoshot"}
    assert all(p["alpha_s"] >= 0 and p["s_per_byte"] >= 0 for p in e["paths"].values())
    assert [s for s, _ in e["points"]["oneshot"]] == [16 << 10, 64 << 10, 256 << 10]
    assert e["min_bytes"] <= e["twoshot_min_bytes"] or e["min_bytes"] == e["twoshot_min_bytes"]
    import torch

    from lowbit.comm.costmodel import PathFit, policy_window
    from lowbit.comm.policy import NO_MAX

    # the written window is what the written lines imply
    lines = {p: PathFit(**v) for p, v in e["paths"].items()}
    win = policy_window(lines, NO_MAX)
    if win["min_bytes"] < NO_MAX:
        assert (e["min_bytes"], e["twoshot_min_bytes"]) == (win["min_bytes"], win["twoshot_min_bytes"])
    pol = SizePolicy("int4", 2, table=entries)
    assert pol.window(torch.bfloat16)[2] == "table"
    assert pol.twoshot_from(torch.bfloat16) == e["twoshot_min_bytes"]
