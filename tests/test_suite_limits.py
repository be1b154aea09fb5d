"""The suite itself cannot hang: under the project's pytest settings (pyproject) a test that
crashes its worker and a test that never returns both end the run as named failures."""

import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CASES = {
    "test_crash.py": "import ctypes\n\ndef test_crashes_its_worker():\n    ctypes.string_at(0)  # SIGSEGV, as a native op with a bad shape would\n",
    "test_hang.py": "import time\n\ndef test_never_returns():\n    time.sleep(3600)\n",
    "test_fine.py": "def test_fine():\n    pass\n",
}


def test_crash_and_hang_are_named_failures(tmp_path):
    """With the distribution mode scripts/test.sh uses (xdist's loadfile mode hangs here)."""
    dist = re.search(r"--dist (\w+)", (ROOT / "scripts" / "test.sh").read_text()).group(1)
    for name, text in CASES.items():
        (tmp_path / name).write_text(text)
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path),
                        "-p", "no:cacheprovider", "-n", "2", "--dist", dist, "-o", "timeout=5",
                        *(str(tmp_path / name) for name in CASES)],
                       capture_output=True, text=True, timeout=240, cwd=tmp_path)
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    assert re.search(r"FAILED \S*test_crashes_its_worker", out), out
    assert re.search(r"FAILED \S*test_never_returns", out), out  # stopped by the time limit
    assert "1 passed" in out, out  # the healthy test still ran
    assert time.monotonic() - t0 < 200
