"""Running :mod:`.vllm_worker` from lowbit's environment: find a Python that has vLLM, hand it a
request, wait with a time limit, read the result. vLLM and lowbit need different transformers
versions, so vLLM usually lives in its own environment (``scripts/venv_vllm.sh`` makes
``.venv-vllm``); ``LOWBIT_VLLM_PYTHON`` names another interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from lowbit.errors import LowbitError
from lowbit.io.json_worker import WorkerFailed, run_json_worker

WORKER = Path(__file__).with_name("vllm_worker.py")
REPO_VENV = Path(__file__).resolve().parents[2] / ".venv-vllm"
STAMP = ".lowbit-vllm-installed"  # written by scripts/venv_vllm.sh once the whole install succeeded


class VLLMUnavailable(LowbitError, RuntimeError):
    """No Python with vLLM was found (the message says where it looked and how to make one)."""


class VLLMFailed(LowbitError, RuntimeError):
    """The vLLM worker exited with an error or ran past its time limit (the message holds its output's tail)."""


def _has_vllm(python: str) -> bool:
    try:
        r = subprocess.run([python, "-c", "import vllm"], capture_output=True, timeout=180)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


def find_python() -> str:
    """The interpreter that runs vLLM: ``LOWBIT_VLLM_PYTHON``, else ``.venv-vllm``, else this one."""
    env = os.environ.get("LOWBIT_VLLM_PYTHON")
    if env:
        if not _has_vllm(env):
            raise VLLMUnavailable(f"LOWBIT_VLLM_PYTHON={env} cannot import vllm")
        return env
    if (REPO_VENV / STAMP).exists() and _has_vllm(str(REPO_VENV / "bin" / "python")):
        return str(REPO_VENV / "bin" / "python")
    if _has_vllm(sys.executable):
        return sys.executable
    state = ("does not exist" if not REPO_VENV.exists() else "is incomplete (no install stamp)"
             if not (REPO_VENV / STAMP).exists() else "cannot import vllm")
    tried = [f"{REPO_VENV} ({state})", sys.executable]
    raise VLLMUnavailable("vLLM is not installed: tried " + ", ".join(tried)
                          + "; run `bash scripts/venv_vllm.sh` (makes .venv-vllm, ~10 min, ~3.5 GB)")


def run_worker(request: dict, timeout: float, python: str | None = None) -> dict:
    """Run one vLLM engine on ``request`` (see :mod:`.vllm_worker`) and return its result."""
    try:
        return run_json_worker(python or find_python(), WORKER, request, timeout,
                               f"vLLM worker on {request['model']}")[0]
    except WorkerFailed as e:
        raise VLLMFailed(str(e)) from None
