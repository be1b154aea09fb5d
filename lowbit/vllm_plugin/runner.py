"""Run :mod:`.worker` (one vLLM engine with the plugin) from lowbit's environment: hand it a
request, wait with a time limit, read its result. ``python`` is an interpreter with vLLM and
lowbit installed (``.venv-vllm``: ``lowbit.bench.vllm_engine.find_python`` finds it)."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

from lowbit.errors import LowbitError

WORKER = Path(__file__).with_name("worker.py")


class PluginRunFailed(LowbitError, RuntimeError):
    """The vLLM worker exited with an error or ran past its time limit (the message holds its output's tail)."""


def run(request: dict, timeout: float, python: str) -> dict:
    """The worker's result for ``request`` (see :mod:`.worker`)."""
    with tempfile.TemporaryDirectory(prefix="lowbit-vllm-plugin-") as tmp:
        req, res = Path(tmp) / "request.json", Path(tmp) / "result.json"
        req.write_text(json.dumps(request))
        # its own session, so a timeout also ends vLLM's engine-core child process
        proc = subprocess.Popen([python, str(WORKER), str(req), str(res)], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            out, _ = proc.communicate()
            raise PluginRunFailed(f"vLLM (lowbit plugin) ran past {timeout:.0f} s; its output ends:\n{out[-3000:]}") from None
        if proc.returncode != 0 or not res.exists():
            raise PluginRunFailed(f"vLLM (lowbit plugin) failed (exit {proc.returncode}); its output ends:\n{out[-3000:]}")
        result = json.loads(res.read_text())
        # the plugin's own lines (which kernels ran, the KV cache note) wherever they are, then the tail
        mine = [line for line in out.splitlines() if "lowbit" in line and "plugin" in line]
        result["log"] = "\n".join(mine) + "\n" + out[-20000:]
        return result
