"""Run :mod:`.worker` (one vLLM engine with the plugin) from lowbit's environment: hand it a
request, wait with a time limit, read its result. ``python`` is an interpreter with vLLM and
lowbit installed (``.venv-vllm``: ``lowbit.bench.vllm_engine.find_python`` finds it)."""

from __future__ import annotations

from pathlib import Path

from lowbit.errors import LowbitError
from lowbit.io.json_worker import WorkerFailed, run_json_worker

WORKER = Path(__file__).with_name("worker.py")


class PluginRunFailed(LowbitError, RuntimeError):
    """The vLLM worker exited with an error or ran past its time limit (the message holds its output's tail)."""


def run(request: dict, timeout: float, python: str) -> dict:
    """The worker's result for ``request`` (see :mod:`.worker`)."""
    try:
        result, out = run_json_worker(python, WORKER, request, timeout, "vLLM (lowbit plugin)")
    except WorkerFailed as e:
        raise PluginRunFailed(str(e)) from None
    # the plugin's own lines (which kernels ran, the KV cache note) wherever they are, then the tail
    mine = [line for line in out.splitlines() if "lowbit" in line and "plugin" in line]
    result["log"] = "\n".join(mine) + "\n" + out[-20000:]
    return result
