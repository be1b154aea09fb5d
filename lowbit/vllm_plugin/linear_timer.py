"""Wall time spent inside vLLM's linear layers, so a decode benchmark can split a step into the
linears and the rest (attention, norms, sampler, scheduler): where the rest dominates, no kernel
can make the step faster. Runs in vLLM's environment (:mod:`.worker`), eager engines only (a
compiled graph calls no Python ``apply``).

Every quantization method's ``apply`` is timed: vLLM's float and quantized linears and lowbit's
(:class:`lowbit.vllm_plugin.vllm_method.LowbitLinearMethod`, input gather and bias included), and
the LM head's logits matmul (``UnquantizedEmbeddingMethod.apply``; its lookup is ``embedding``).
"""

from __future__ import annotations

import functools
import time

from vllm.model_executor.layers.linear import LinearMethodBase
from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod


def _subclasses(cls: type) -> list[type]:
    out = [cls]
    for sub in cls.__subclasses__():
        out += _subclasses(sub)
    return out


class LinearTimer:
    """``with LinearTimer() as t: ...`` → ``t.seconds`` and ``t.calls`` of every ``apply`` run inside.
    Install it after the engine is built (its methods' classes are imported by then)."""

    def __init__(self) -> None:
        self.seconds, self.calls, self._saved, self._depth = 0.0, 0, [], 0

    def _wrap(self, apply):
        @functools.wraps(apply)
        def timed(*args, **kwargs):
            if self._depth:  # an apply calling another timed one (super().apply): counted by the outer
                return apply(*args, **kwargs)
            self._depth += 1
            t0 = time.perf_counter()
            try:
                return apply(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t0
                self.calls += 1
                self._depth -= 1

        return timed

    def __enter__(self) -> "LinearTimer":
        for cls in {*_subclasses(LinearMethodBase), UnquantizedEmbeddingMethod}:
            if "apply" in cls.__dict__ and not getattr(cls.__dict__["apply"], "__isabstractmethod__", False):
                self._saved.append((cls, cls.__dict__["apply"]))
                cls.apply = self._wrap(cls.__dict__["apply"])
        return self

    def __exit__(self, *exc) -> None:
        for cls, apply in reversed(self._saved):
            cls.apply = apply
        self._saved.clear()
