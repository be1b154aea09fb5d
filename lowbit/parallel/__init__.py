"""Tensor parallelism: launching ranks, one rank's shard of a float or quantized checkpoint, and
the sharded layers that sum their outputs with a plain or quantized all-reduce (lowbit.comm).
The split rule lives with the architectures, in lowbit.models.shard_plan."""

from .shard import load_tp_shard

__all__ = ["load_tp_shard"]
