"""Build a C source with the system compiler into the lowbit cache and load it with ctypes.

No torch headers and no ninja: ``cc <flags> -shared -fPIC``. The cached library is keyed by a hash
of the sources (every ``.c``/``.h`` next to the source), the flags, the compiler and this CPU's
model and feature flags, so a cache shared between machines never hands one CPU another's
instructions. Where libraries are stored and when a cached one may be loaded (owner, mode and
content hash checks, atomic writes) is :mod:`lowbit.native.cache`. A build that fails
returns None: the callers keep a pure-torch path.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
from pathlib import Path

from lowbit.native import cache as native_cache


def cache_dir() -> Path:
    """The directory native libraries are built into and loaded from (a private temporary one
    when the configured cache is not safe to load from)."""
    return native_cache.library_dir()


def cpu_id() -> bytes:
    """This CPU's model and feature flags (Linux), so -march=native builds are per CPU."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor().encode()
    keep = [ln for ln in text.splitlines() if ln.startswith(("flags", "model name", "Features", "CPU part"))]
    return "\n".join(sorted(set(keep))).encode()


def compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


SHARED_CSRC = Path(__file__).with_name("csrc")  # headers every library may include (butterfly_simd.h)


def _sources(src: Path) -> bytes:
    files = sorted(src.parent.glob("*.[ch]")) + sorted(SHARED_CSRC.glob("*.h"))
    return b"".join(p.name.encode() + p.read_bytes() for p in files)


def compile_library(src: Path, flags: tuple[str, ...], libs: tuple[str, ...] = ("-lm",)) -> ctypes.CDLL | None:
    """``src`` built with ``flags`` (cached), or None if there is no compiler or it fails."""
    cc = compiler()
    if not cc:
        return None
    key = _sources(src) + " ".join(flags + libs).encode() + platform.machine().encode() + cc.encode() + cpu_id()
    so = cache_dir() / f"{src.stem}_{hashlib.sha256(key).hexdigest()[:16]}.so"
    if not native_cache.verified(so):  # absent, planted, truncated or without its build record
        tmp = native_cache.temp_path(so.parent, ".so")
        try:
            r = subprocess.run([cc, *flags, "-shared", "-fPIC", str(src), "-o", str(tmp), *libs], capture_output=True)
            if r.returncode != 0:
                return None
            native_cache.publish(tmp, so)
        finally:
            tmp.unlink(missing_ok=True)
    try:
        return ctypes.CDLL(str(so))
    except OSError:
        return None


def first_that_builds(src: Path, flag_sets) -> tuple[ctypes.CDLL | None, tuple[str, ...] | None]:
    """The first of ``flag_sets`` (tuples of flags) that compiles ``src``, and those flags."""
    for flags in flag_sets:
        lib = compile_library(src, tuple(flags))
        if lib is not None:
            return lib, tuple(flags)
    return None, None


class NativeLibrary:
    """A C source built on first use with the first of ``flag_sets`` that compiles (a tuple, or a
    function returning one, evaluated at the first build: the ISA variants depend on the CPU and on
    ``LOWBIT_ISA``), or with explicit flags (tests); its ctypes signatures set by ``bind(lib)``;
    cached per flags. ``flags`` is what the best build used (None before it, or if none built)."""

    def __init__(self, src: Path, flag_sets, bind) -> None:
        self.src, self.bind = src, bind
        self._flag_sets = flag_sets if callable(flag_sets) else tuple(tuple(f) for f in flag_sets)
        self._libs: dict[tuple[str, ...], ctypes.CDLL | None] = {}
        self.flags: tuple[str, ...] | None = None

    @property
    def flag_sets(self) -> tuple[tuple[str, ...], ...]:
        return tuple(tuple(f) for f in self._flag_sets()) if callable(self._flag_sets) else self._flag_sets

    def get(self, flags: tuple[str, ...] | None = None) -> ctypes.CDLL | None:
        key = tuple(flags) if flags is not None else ("best",)
        if key not in self._libs:
            if flags is None:
                lib, self.flags = first_that_builds(self.src, self.flag_sets)
            else:
                lib = compile_library(self.src, tuple(flags))
            self._libs[key] = None if lib is None else (self.bind(lib) or lib)
        return self._libs[key]


def kernel_flag_sets() -> tuple[tuple[str, ...], ...]:
    """The builds every native kernel tries: this CPU's ISA variant (:mod:`.isa`), then narrower ones
    (threads come from csrc/work_pool.h, plain pthreads)."""
    from lowbit.native import isa

    return isa.flag_sets(("-pthread",))
