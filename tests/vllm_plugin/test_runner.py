"""The plugin's worker runner: a failing or hanging vLLM process is a clear error, never a hang."""

import sys

import pytest

from lowbit.vllm_plugin.runner import PluginRunFailed, run


def test_a_python_without_vllm_fails_with_its_output():
    try:
        import vllm  # noqa: F401
        pytest.skip("this Python has vLLM")
    except ImportError:
        pass
    with pytest.raises(PluginRunFailed, match="No module named 'vllm'"):
        run({"engines": []}, timeout=120, python=sys.executable)


def test_a_hanging_worker_is_killed_at_the_time_limit(tmp_path):
    slow = tmp_path / "python"
    slow.write_text("#!/bin/sh\necho started\nsleep 60\n")
    slow.chmod(0o755)
    with pytest.raises(PluginRunFailed, match=r"ran past 1 s(.|\n)*started"):
        run({"engines": []}, timeout=1, python=str(slow))


def test_a_decode_batch_larger_than_its_prompts_is_refused():
    """A batch of 64 timed on 16 prompts would report 16 sequences' steps as 64's (it did once)."""
    from lowbit.vllm_plugin import worker

    job = {"kind": "decode", "prompts": [[1, 2, 3]] * 16, "batches": [64], "new": 4, "repeats": 1}
    with pytest.raises(ValueError, match="batch 64 needs 64 prompts, the job gives 16"):
        worker._decode(None, None, job)
