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
