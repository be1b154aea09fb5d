"""lowbit's quantized linears as one torch custom op, ``torch.ops.lowbit.linear(x, handle)``, so
``torch.compile`` graphs (vLLM's among them) can hold them as opaque calls.

The weights stay in the layout :func:`lowbit.kernels.dispatch.prepare` built once for the chosen
kernel (packed codes whose raw pointers the C kernels cache, or torch's packed int4): the op takes
the activation and a *handle* (a short string, which a graph always treats as a constant, where
an integer may become a symbolic size under recompilation) to that :class:`PreparedLinear` and runs exactly what a
direct ``prepared.batched(x)`` runs (after the handle's ``before`` transform of x, where one was
registered), so the two agree bit for bit. A graph sees the handle as a
constant and the output's shape and dtype from the fake implementation: ``[..., out]`` of x's
dtype, as :meth:`PreparedLinear.batched` returns it.

A handle lives as long as the object it was registered for (``owner``: a module or layer); when
the owner is garbage-collected the prepared weights are released.

Non-finite activations: an A8/A4 kernel raises :class:`NonFiniteActivations` (no integer code
holds NaN or Inf), as lowbit's own loop wants. A handle registered with ``nan_rows=True`` instead
gives such a token NaN outputs, as a float linear does, and the other tokens their usual values:
a serving engine must not die on its own warm-up, which feeds uninitialized buffers (vLLM's
compiled CPU warm-up runs attention without metadata, leaving its output ``torch.empty``).
"""

from __future__ import annotations

import itertools
import time
import weakref
from dataclasses import dataclass
from typing import Callable

import torch

from lowbit.kernels import op_stats
from lowbit.kernels.dispatch import PreparedLinear
from lowbit.kernels.linear_params import KernelError, NonFiniteActivations

@dataclass(frozen=True)
class _Registered:
    """What a handle stands for: the prepared linear and how the op treats its input."""

    prepared: PreparedLinear
    nan_rows: bool = False
    before: Callable[[torch.Tensor], torch.Tensor] | None = None


_REGISTERED: dict[str, _Registered] = {}
_NEXT = itertools.count(1)


def register(prepared: PreparedLinear, owner: object | None = None, nan_rows: bool = False,
             before: Callable[[torch.Tensor], torch.Tensor] | None = None) -> str:
    """A handle for ``prepared`` (released with ``owner`` when given, else by :func:`release`);
    ``nan_rows``: non-finite tokens give NaN outputs instead of an error (module docstring);
    ``before``: what the op applies to x first, inside the op (an online transform of the input,
    token by token and shape-preserving, so the fake still holds)."""
    if not isinstance(prepared, PreparedLinear):
        raise TypeError(f"register needs a PreparedLinear, got {type(prepared).__name__}")
    if before is not None and not callable(before):
        raise TypeError(f"before must be callable, got {type(before).__name__}")
    # The fake's output (shape from in/out features) is a function of the handle string alone:
    # inductor's on-disk graph cache, shared between processes, keys a compiled graph by its code,
    # which holds the handle, so another process's "linear7" of another size would otherwise be
    # handed this one's buffers (seen: NaN rows under torch.compile in a later test process).
    handle = f"linear{next(_NEXT)}_{prepared.in_features}x{prepared.out_features}"
    _REGISTERED[handle] = _Registered(prepared, bool(nan_rows), before)
    if owner is not None:
        weakref.finalize(owner, release, handle)
    return handle


def release(handle: str) -> None:
    _REGISTERED.pop(handle, None)


def _registered(handle: str) -> _Registered:
    try:
        return _REGISTERED[handle]
    except KeyError:
        raise KernelError(f"no prepared lowbit linear with handle {handle!r} (released, or from another process)") from None


def prepared(handle: str) -> PreparedLinear:
    return _registered(handle).prepared


def linear(x: torch.Tensor, handle: str) -> torch.Tensor:
    """``x [..., in]`` → ``[..., out]`` of x's dtype through the prepared linear ``handle``: the
    op's body, which eager callers may call directly (no dispatcher crossing; see :func:`call`).
    Timed into :data:`op_stats.STATS` where ``LOWBIT_OP_STATS`` asks for it."""
    if op_stats.STATS is None:
        return _linear(x, handle)
    t0 = time.perf_counter()
    y = _linear(x, handle)
    op_stats.STATS.add(handle, time.perf_counter() - t0, x.numel() // max(x.shape[-1], 1) if x.dim() else 0)
    return y


def _linear(x: torch.Tensor, handle: str) -> torch.Tensor:
    r = _registered(handle)
    if r.before is not None:
        x = r.before(x)
    try:
        y = r.prepared.batched(x)
    except NonFiniteActivations:
        if not r.nan_rows:
            raise
        y = _with_nan_rows(r.prepared, x)
    # a fresh contiguous tensor, as the fake promises (the native kernels may slice padded rows off)
    return y if y.is_contiguous() else y.contiguous()


def _with_nan_rows(p: PreparedLinear, x: torch.Tensor) -> torch.Tensor:
    """The finite tokens through the kernel (the others zeroed first), the others NaN."""
    bad = ~torch.isfinite(x).all(-1)
    y = p.batched(x.masked_fill(bad[..., None], 0)).clone()
    y[bad] = float("nan")
    return y


# Defined through torch.library.Library rather than the custom_op decorator: the same schema and
# fake, at half the per-call cost (measured 11 against 22 µs on 2 loaded Zen 3 cores; a decode step
# of the default model makes 120 calls). Not differentiable: the kernels are inference only.
_LIB = torch.library.Library("lowbit", "DEF")
_LIB.define("linear(Tensor x, str handle) -> Tensor")
_LIB.impl("linear", linear, "CPU")


@torch.library.register_fake("lowbit::linear", lib=_LIB)
def _linear_fake(x: torch.Tensor, handle: str) -> torch.Tensor:
    p = prepared(handle)
    if x.dim() == 0 or x.shape[-1] != p.in_features:
        raise ValueError(f"{p.kind} linear expects [..., {p.in_features}] input, got {tuple(x.shape)}")
    return x.new_empty(*x.shape[:-1], p.out_features)


def call(x: torch.Tensor, handle: str) -> torch.Tensor:
    """What a layer's forward runs: the op inside a graph being compiled (so the graph holds it),
    its body directly in eager mode (the same function, so the same bits, without the dispatcher)."""
    if torch.compiler.is_compiling():
        return torch.ops.lowbit.linear(x, handle)
    return linear(x, handle)
