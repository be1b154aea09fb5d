"""Communication: all-reduce codecs, the one-shot and two-shot quantized all-reduces, size policy and cost model.

Tensor parallelism, which uses it, is lowbit.parallel; its benchmarks are in lowbit.bench.

Public API: ``QuickAllReduce`` (lowbit.comm.allreduce), the codecs (lowbit.comm.codecs: encode,
decode, CODECS), the size policy (lowbit.comm.policy) and the error accounting
(lowbit.comm.accuracy).
"""

from .allreduce import QuickAllReduce
from .twoshot import two_shot
from .errors import AllReduceError, MetadataMismatchError
from .oneshot import one_shot

__all__ = ["QuickAllReduce", "two_shot", "one_shot", "AllReduceError", "MetadataMismatchError"]
