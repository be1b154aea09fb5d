"""Model surgery that puts the fast kernels in a model: ``accelerate(model)`` swaps QuantLinears
for kernel-backed linears, ``fuse`` merges q/k/v and gate/up, ``use_native_ops(model)`` runs
norms, rotary embedding and decode attention as single native calls."""

from .linears import KernelLinear, accelerate

__all__ = ["KernelLinear", "accelerate"]
