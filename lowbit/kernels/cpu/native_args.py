"""Checks made before lowbit's C kernels read a tensor through its raw pointer, and the pickling of
the prepared weights that cache such pointers. The C trusts every pointer it gets: a meta or CUDA
tensor's ``data_ptr()`` is no CPU memory, another kind's prepared weights hold other sizes, and a
cached pointer outlives a pickle round trip or a deep copy's original; each would be a crash or a
wrong number instead of an error. The checks are a few attribute tests, once per call."""

from __future__ import annotations

import torch

from lowbit.kernels.cpu import a16_linear
from lowbit.kernels.linear_params import KernelError


def require_cpu(what: str, *tensors: torch.Tensor) -> None:
    """ValueError unless every tensor is in CPU memory (None entries are skipped). ``is_cpu``: a
    tenth of the cost of ``device.type`` (about 40 ns against 300), and this runs on every call."""
    for t in tensors:
        if t is not None and not t.is_cpu:
            raise ValueError(f"{what}: needs CPU tensors, got one on {t.device}")


def require_state(w, cls: type, what: str) -> None:
    """KernelError unless ``w`` is ``cls``: another kernel's prepared weights hold other buffers and
    sizes, which the C would read as this one's."""
    if not isinstance(w, cls):
        raise KernelError(f"{what}: needs {cls.__name__} weights, got {type(w).__name__}")


class CachedPointers:
    """Mixin for prepared weights whose ``__post_init__`` caches raw pointers in ``args``: pickling
    (``torch.save``) leaves them out and unpickling rebuilds them from the loaded tensors, a deep
    copy from its own tensors; the saved ints would point into freed or foreign memory."""

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.pop("args", None)
        return state

    def __setstate__(self, state: dict) -> None:
        state = dict(state)
        state.pop("args", None)  # pickles made before this class dropped them
        self.__dict__.update(state)
        self.__post_init__()

    def __deepcopy__(self, memo):
        return a16_linear.copy_prepared(self, memo)
