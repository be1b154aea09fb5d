"""lowbit's own formats inside vLLM: a quantization plugin (``quantization="lowbit"``) that serves
lowbit checkpoints (W4A4 with INT8 outliers and reorder, W4A16, W8A8, W8A16) on lowbit's CPU
kernels inside vLLM's scheduler.

Installing lowbit registers :func:`register` as a ``vllm.general_plugins`` entry point; vLLM calls
it in each of its processes. vLLM is imported here only then (lowbit's own environment has no
vLLM): :mod:`.plan` decides what to run from the checkpoint alone, :mod:`.vllm_method` is vLLM's side.
"""

from __future__ import annotations


def register() -> None:
    """Register ``LowbitConfig`` under the name ``lowbit`` (idempotent: vLLM may call it again).
    lowbit's kernels run their items on torch's OpenMP team here by their default
    (``LOWBIT_THREADS=auto``, ``csrc/work_pool.h``): vLLM's own operators are back-to-back OpenMP
    regions, whose spinning threads a second thread pool fights for the cores
    (``scripts/vllm_threads_ab.py`` on 2 cores, W8A8 linears and vLLM's norms at 4 tokens: 16.2 ms
    a step on lowbit's pool, 9.4-9.6 on the team or auto, vLLM's own int8 9.3-9.6)."""
    from vllm.model_executor.layers.quantization import register_quantization_config

    from lowbit.vllm_plugin.plan import NAME
    from lowbit.vllm_plugin.vllm_method import LowbitConfig

    register_quantization_config(NAME)(LowbitConfig)
