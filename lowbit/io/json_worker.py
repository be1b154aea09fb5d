"""Run a Python script in another interpreter on one JSON request and read its JSON result, with a
time limit. vLLM lives in its own environment, so lowbit talks to it this way (the benchmark's
vLLM worker and the plugin's test worker alike)."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path


class WorkerFailed(RuntimeError):
    """The worker exited with an error, wrote no result or ran past its time limit."""


def run_json_worker(python: str, script: Path, request: dict, timeout: float, what: str) -> tuple[dict, str]:
    """``(result, output)`` of ``python script request.json result.json``; :class:`WorkerFailed`
    naming ``what`` and the output's tail otherwise. The worker runs in its own session, so a
    timeout ends its children (vLLM's engine-core process) too."""
    with tempfile.TemporaryDirectory(prefix="lowbit-worker-") as tmp:
        req, res = Path(tmp) / "request.json", Path(tmp) / "result.json"
        req.write_text(json.dumps(request))
        proc = subprocess.Popen([python, str(script), str(req), str(res)], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            out, _ = proc.communicate()
            raise WorkerFailed(f"{what} ran past {timeout:.0f} s; its output ends:\n{out[-3000:]}") from None
        if proc.returncode != 0 or not res.exists():
            raise WorkerFailed(f"{what} failed (exit {proc.returncode}); its output ends:\n{out[-3000:]}")
        return json.loads(res.read_text()), out
