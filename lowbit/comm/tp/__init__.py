"""Tensor-parallel inference of Hugging Face decoders with plain or quantized all-reduce.

``load_tp_shard`` builds one rank's shard from a checkpoint (lowbit.comm.tp.shard); the split
rule is in lowbit.comm.tp.plan; ``run_tp_eval`` (lowbit.comm.tp.eval) launches the ranks and
returns perplexity or KL on rank 0; ``decode_bench`` (lowbit.comm.tp.decode) times greedy decoding
under TP per all-reduce, unshaped and on shaped links (``lowbit bench tp-decode``).
"""

from .plan import TPSplitError, attention_plan, make_plan
from .shard import load_tp_shard

__all__ = ["TPSplitError", "attention_plan", "make_plan", "load_tp_shard"]
