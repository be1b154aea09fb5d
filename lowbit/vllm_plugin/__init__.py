"""lowbit's own formats inside vLLM: a quantization plugin (``quantization="lowbit"``) that serves
lowbit checkpoints (W4A4 with INT8 outliers and reorder, W4A16, W8A8, W8A16) on lowbit's CPU
kernels inside vLLM's scheduler.

Installing lowbit registers :func:`register` as a ``vllm.general_plugins`` entry point; vLLM calls
it in each of its processes. vLLM is imported here only then (lowbit's own environment has no
vLLM): :mod:`.plan` decides what to run from the checkpoint alone, :mod:`.vllm_method` is vLLM's side.
"""

from __future__ import annotations


def register() -> None:
    """Register ``LowbitConfig`` under the name ``lowbit`` (idempotent: vLLM may call it again), and
    have lowbit's kernels run their items on torch's OpenMP team in vLLM's processes
    (``LOWBIT_THREADS=omp`` unless set: ``csrc/work_pool.h``). vLLM's own operators are back-to-back
    OpenMP regions, whose spinning threads a second thread pool fights for the cores; lowbit's
    default, auto, leaves the team for its pool after late regions, and in a server the engine
    process (which spins on the worker's results) makes them late: the pool's thread then takes CPU
    the team wants (``scripts/serve_thread_modes.py``, 2 cores, plugin W4A4 at concurrency 64, 13
    interleaved rounds: omp ahead of auto in 9, median 1.04x)."""
    import os

    os.environ.setdefault("LOWBIT_THREADS", "omp")
    from vllm.model_executor.layers.quantization import register_quantization_config

    from lowbit.vllm_plugin.plan import NAME
    from lowbit.vllm_plugin.vllm_method import LowbitConfig

    register_quantization_config(NAME)(LowbitConfig)
