"""Instruction-set variants of the native libraries, chosen per CPU at load time.

What a variant changes today: AVX2 vectorises every kernel; the VNNI variants (AVX-VNNI on
AVX2-only cores, AVX512-VNNI) fuse each int16 multiply-add and its accumulation into one
``vpdpwssd`` (the same integers); AVX-512 and BF16 let the compiler use them where it can; AMX
runs the batched kernels on int8 tiles (W8A8 / W4A4 from 8 / 48 tokens, the A16 kinds' exact path
from 8) and bfloat16 A16 calls of many tokens on bfloat16 tiles.

Each variant is a set of compiler target flags, so every variant compiles on every x86-64 machine
(the compiler does not need the instructions it emits; ``tests/native/test_isa.py`` builds them
all), and the C sources pick their code paths from the predefined macros (``__AVX2__``,
``__AVX512VNNI__``, ...). The variant used is the widest whose features this CPU reports
(:mod:`.cpu_features`); ``LOWBIT_ISA=NAME`` forces one, and forcing one this CPU cannot run is an
error, never an illegal instruction. Every variant the test CPU runs is tested bit-identical to
the portable build.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass

from lowbit.errors import LowbitError


class ISAError(LowbitError, RuntimeError):
    """LOWBIT_ISA names no variant, or one this CPU cannot run."""


@dataclass(frozen=True)
class Variant:
    name: str
    flags: tuple[str, ...]  # beyond -O3
    needs: tuple[str, ...]  # /proc/cpuinfo feature names


    def plus(self, name: str, pairs: tuple[tuple[str, str], ...]) -> "Variant":
        """This variant with more (compiler flag, cpuinfo feature) pairs."""
        return Variant(name, self.flags + tuple(f for f, _ in pairs), self.needs + tuple(n for _, n in pairs))


_PORTABLE = Variant("portable", (), ())
_AVX2 = _PORTABLE.plus("avx2", (("-mavx2", "avx2"), ("-mfma", "fma"), ("-mf16c", "f16c")))
_AVX512 = _AVX2.plus("avx512", (("-mavx512f", "avx512f"), ("-mavx512bw", "avx512bw"), ("-mavx512vl", "avx512vl")))
_AVX512VNNI = _AVX512.plus("avx512vnni", (("-mavx512vnni", "avx512_vnni"),))
_AVX512BF16 = _AVX512VNNI.plus("avx512bf16", (("-mavx512bf16", "avx512_bf16"),))
VARIANTS = (  # narrowest first
    _PORTABLE,
    _AVX2,
    _AVX2.plus("avxvnni", (("-mavxvnni", "avx_vnni"),)),
    _AVX512,
    _AVX512VNNI,
    _AVX512BF16,
    _AVX512BF16.plus("amx", (("-mamx-tile", "amx_tile"), ("-mamx-int8", "amx_int8"), ("-mamx-bf16", "amx_bf16"))),
)
BY_NAME = {v.name: v for v in VARIANTS}


def x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64", "i686", "i386")


def _features() -> dict[str, bool]:
    from lowbit.native.cpu_features import cpu_info

    return cpu_info()["features"]


def missing(v: Variant, features: dict[str, bool] | None = None) -> list[str]:
    """The features ``v`` needs that this CPU (or ``features``) lacks."""
    if not v.needs:
        return []
    if not x86():
        return list(v.needs)
    feats = _features() if features is None else features
    return [f for f in v.needs if not feats.get(f, False)]


def runnable(v: Variant, features: dict[str, bool] | None = None) -> bool:
    """Whether this CPU (or ``features``) has every instruction set ``v`` emits."""
    return not missing(v, features)


def selected(features: dict[str, bool] | None = None) -> Variant:
    """``LOWBIT_ISA`` if set (refused if this CPU cannot run it), else the widest runnable variant."""
    forced = os.environ.get("LOWBIT_ISA", "").strip()
    if forced:
        if forced not in BY_NAME:
            raise ISAError(f"LOWBIT_ISA={forced!r} is not a variant; choose from {', '.join(BY_NAME)}")
        v = BY_NAME[forced]
        if lacks := missing(v, features):
            raise ISAError(f"LOWBIT_ISA={forced}: this CPU lacks {', '.join(lacks)}")
        return v
    return [v for v in VARIANTS if runnable(v, features)][-1]


def flag_sets(extra: tuple[str, ...] = ("-pthread",)) -> tuple[tuple[str, ...], ...]:
    """The builds a native library tries, best first: the selected variant, then narrower runnable
    ones down to portable (a compiler too old for a variant's flags falls back, it never fails)."""
    top = selected()
    chain = [v for v in VARIANTS[: VARIANTS.index(top) + 1] if runnable(v)][::-1]
    return tuple(("-O3", *v.flags, *extra) for v in chain)


def variant_of(flags: tuple[str, ...]) -> str:
    """The variant a flag set builds (its widest target flags), for reports."""
    for v in reversed(VARIANTS):
        if v.flags and all(f in flags for f in v.flags):
            return v.name
    return "portable"
