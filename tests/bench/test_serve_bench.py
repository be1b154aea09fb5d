"""``lowbit bench serve``: its errors (bad formats, no vLLM, a failing or hanging worker) and,
where the vLLM environment exists, one tiny real run against vLLM."""

import json
import sys

import pytest

from lowbit.bench.vllm_engine import VLLMFailed, VLLMUnavailable, find_python, run_worker
from lowbit.cli import main


def test_bad_formats_are_refused(tmp_path):
    assert main(["bench", "serve", "--formats", "w4a4", "--out", str(tmp_path)]) == 2
    assert main(["bench", "serve", "--new", "1", "--out", str(tmp_path)]) == 2


def test_a_python_without_vllm_is_named(monkeypatch, tmp_path, capsys):
    try:
        import vllm  # noqa: F401
        pytest.skip("this Python has vLLM")
    except ImportError:
        pass
    monkeypatch.setenv("LOWBIT_VLLM_PYTHON", sys.executable)
    with pytest.raises(VLLMUnavailable, match="cannot import vllm"):
        find_python()
    assert main(["bench", "serve", "--out", str(tmp_path / "o")]) == 2  # one line, before any work
    assert "LOWBIT_VLLM_PYTHON" in capsys.readouterr().err


def test_a_failing_worker_reports_its_output(tmp_path):
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'engine exploded' >&2\nexit 3\n")
    fake.chmod(0o755)
    with pytest.raises(VLLMFailed, match=r"(?s)exit 3\).*engine exploded"):
        run_worker({"model": "m", "jobs": []}, timeout=60, python=str(fake))


def test_a_hanging_worker_is_stopped_by_its_time_limit(tmp_path):
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho started\nsleep 600\n")
    fake.chmod(0o755)
    with pytest.raises(VLLMFailed, match="ran past 2 s"):
        run_worker({"model": "m", "jobs": []}, timeout=2, python=str(fake))


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.timeout(900)  # two vLLM engines start (eager), on two shared cores
def test_serve_small_real_run(tmp_path):
    try:
        find_python()
    except VLLMUnavailable as e:
        pytest.skip(str(e))
    rc = main(["bench", "serve", "--formats", "w4a16", "--batches", "1", "2", "--prompt", "8", "--new", "4",
               "--repeats", "1", "--calib", "1x32", "--eager", "--out", str(tmp_path)])
    assert rc == 0
    data = json.loads((tmp_path / "serve.json").read_text())
    rows = data["rows"]
    keys = {(r["engine"], r["format"], r["batch"]) for r in rows}
    assert keys == {(e, f, b) for e in ("vllm", "lowbit") for f in ("bf16", "w4a16") for b in (1, 2)}
    assert all(r["gen_tok_s"] > 0 for r in rows)
    for r in rows:  # the baseline is vLLM's bf16 at the same batch
        if (r["engine"], r["format"]) == ("vllm", "bf16"):
            assert r["vs_vllm_bf16"] == 1.0
    assert data["meta"]["machine"]["cpu"]["model"] and data["meta"]["vllm"]["w4a16"]["vllm"]
    assert (tmp_path / "serve.png").stat().st_size > 0
