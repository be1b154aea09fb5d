"""Prepared weights in 2 MiB pages (Linux transparent huge pages, asked for by ``madvise``).

A decode step reads every weight once, cold from memory, in calls of a few hundred KB. On 4 KiB
pages each page of those reads starts with a TLB miss (a two-level page walk under a VM) and a
hardware prefetcher that stops at the page's end; in 2 MiB pages a call's weights sit in one or
two. The weights of prepared kernels are copied, once, into 2 MiB-aligned chunks marked
``MADV_HUGEPAGE`` and packed one after another (64-byte aligned). Same bytes, other addresses:
no result changes. ``LOWBIT_HUGE_PAGES=0`` turns it off; so does a kernel whose transparent huge
pages are ``never`` (nothing to gain), and so does any platform without ``mmap.MADV_HUGEPAGE``.
"""

from __future__ import annotations

import dataclasses
import mmap
import os
import threading
import weakref
from pathlib import Path

import torch

PAGE = 2 << 20
CHUNK = 32 << 20  # one mapping holds many layers' weights; a larger tensor gets a mapping of its own
MIN_BYTES = 16 << 10  # smaller tensors (biases, scales of small layers) stay where they are
ALIGN = 64
_THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def thp_mode() -> str:
    """The kernel's transparent huge page mode (``always`` | ``madvise`` | ``never``), or
    ``unavailable`` where there is none."""
    try:
        text = _THP.read_text()
    except OSError:
        return "unavailable"
    return next((w.strip("[]") for w in text.split() if w.startswith("[")), "unavailable")


def enabled() -> bool:
    flag = os.environ.get("LOWBIT_HUGE_PAGES", "1") or "1"
    if flag not in ("0", "1"):
        raise ValueError(f"LOWBIT_HUGE_PAGES must be 0 or 1, got {flag!r}")
    return flag == "1" and hasattr(mmap, "MADV_HUGEPAGE") and thp_mode() in ("always", "madvise")


class _Arena:
    """Bump allocation in 2 MiB-aligned anonymous mappings. Each tensor it gives has a storage of
    its own bytes (``torch.save`` writes those, not the mapping) that holds the mapping: a mapping
    is unmapped once every tensor in it is freed (the arena keeps only a weak reference to the one
    it fills). Freed space inside a mapping is not reused, so a process that prepares and drops
    weights over and over while keeping a few can hold up to a mapping per survivor
    (``LOWBIT_HUGE_PAGES=0`` if that matters). Mappings are never closed explicitly."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.map: weakref.ref | None = None
        self.used = self.end = 0

    @staticmethod
    def _mapping(size: int) -> tuple[mmap.mmap, int, int]:
        """A new mapping of ``size`` bytes (whole 2 MiB pages) and its 2 MiB-aligned [start, end)."""
        size = -(-size // PAGE) * PAGE
        m = mmap.mmap(-1, size + PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        start = -torch.frombuffer(m, dtype=torch.uint8, count=1).data_ptr() % PAGE
        m.madvise(mmap.MADV_HUGEPAGE, start, size)
        return m, start, start + size

    def take(self, nbytes: int) -> torch.Tensor:
        with self.lock:
            if nbytes > CHUNK // 4:  # a mapping of its own
                m, start, _ = self._mapping(nbytes)
            else:
                m = self.map() if self.map is not None else None
                start = -(-self.used // ALIGN) * ALIGN
                if m is None or start + nbytes > self.end:
                    m, start, self.end = self._mapping(CHUNK)
                    self.map = weakref.ref(m)
                self.used = start + nbytes
            return torch.frombuffer(m, dtype=torch.uint8, count=nbytes, offset=start)

    def after_fork(self) -> None:
        self.lock = threading.Lock()  # a fork while another thread held it must not deadlock the child


_ARENA = _Arena()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_ARENA.after_fork)


def relocate_tensor(t: torch.Tensor) -> torch.Tensor:
    """A copy of a contiguous CPU tensor in huge pages; ``t`` itself where that does not apply
    (small, strided, sparse, nested, quantized, bool or grad-requiring tensors) or where the
    mapping fails (no memory to map: the weights stay in ordinary pages)."""
    if (t.device.type != "cpu" or t.layout != torch.strided or t.is_nested or t.is_quantized
            or not t.is_contiguous() or t.nbytes < MIN_BYTES or t.requires_grad or t.dtype == torch.bool):
        return t
    try:
        out = _ARENA.take(t.nbytes).view(t.dtype).view(t.shape)
        out.copy_(t)
    except (OSError, RuntimeError, NotImplementedError, TypeError):
        return t
    return out


def relocate(state):
    """``state`` (a prepared kernel's dataclass, nested ones and tensors included) with its large
    tensors moved into huge pages; a dataclass is rebuilt through its constructor, so raw pointers
    it caches in ``__post_init__`` point at the new memory. A no-op where :func:`enabled` is false."""
    if not enabled():
        return state
    return _relocate(state)


def _relocate(v):
    if isinstance(v, torch.Tensor):
        return relocate_tensor(v)
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        changed = {}
        for f in dataclasses.fields(v):
            if f.init:
                old = getattr(v, f.name)
                new = _relocate(old)
                if new is not old:
                    changed[f.name] = new
        return dataclasses.replace(v, **changed) if changed else v
    return v
