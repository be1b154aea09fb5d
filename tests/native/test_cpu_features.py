"""The CPU description every benchmark records (``lowbit env`` printing it: tests/commands/test_env.py)."""

from pathlib import Path

from lowbit.native.cpu_features import FEATURES, cpu_info, summary


def test_features_match_proc_cpuinfo():
    info = cpu_info()
    assert set(info["features"]) == set(FEATURES) and info["cores"] >= 1
    flags = next((ln.split(":", 1)[1].split() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                  if ln.startswith("flags")), [])
    assert {f for f, ok in info["features"].items() if ok} == set(FEATURES) & set(flags)
    assert info["model"] in summary()
