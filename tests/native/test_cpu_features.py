"""The CPU description every benchmark records, and ``lowbit env`` printing it."""

import json
from pathlib import Path

from lowbit.cli import main
from lowbit.native.cpu_features import FEATURES, cpu_info, summary


def test_features_match_proc_cpuinfo():
    info = cpu_info()
    assert set(info["features"]) == set(FEATURES) and info["cores"] >= 1
    flags = next((ln.split(":", 1)[1].split() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                  if ln.startswith("flags")), [])
    assert {f for f, ok in info["features"].items() if ok} == set(FEATURES) & set(flags)
    assert info["model"] in summary()


def test_env_reports_cpu_libraries_and_kernels(tmp_path, capsys):
    assert main(["env", "--json", str(tmp_path / "env.json")]) == 0
    rep = json.loads((tmp_path / "env.json").read_text())
    assert rep["cpu"]["model"] in capsys.readouterr().out
    assert {lib["name"] for lib in rep["native"]} == {"all-reduce codecs", "4-bit linear", "8-bit linear", "decode ops"}
    assert set(rep["kernels"]) == {"w4a16", "w8a16", "w8a8", "w4a4"}
    # a kind runs the native kernel exactly where its library built
    w4 = next(lib["built"] for lib in rep["native"] if lib["name"] == "4-bit linear")
    assert (rep["kernels"]["w4a16"] == "cpu:native") == w4
