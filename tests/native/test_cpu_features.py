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


def test_vendor_matches_proc_cpuinfo():
    """The vendor chooses how the AVX-512 codecs compute integer codes (lowbit.comm.codecs.native)."""
    want = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                 if ln.startswith("vendor_id")), "")
    assert cpu_info()["vendor"] == want
