"""``lowbit bench KIND``: benchmarks that print tables and write plots.

Each benchmark is a module in ``lowbit/bench/`` that defines ``register(subparsers)``.
"""

from __future__ import annotations

import importlib
import pkgutil

import lowbit.bench as bench_pkg


def register(sub) -> None:
    p = sub.add_parser(
        "bench",
        help="benchmarks: codecs, all-reduce, GEMM kernels, decode throughput",
        description="Benchmarks. Each reports ratios measured side by side in one run (medians of repeats).",
    )
    kinds = p.add_subparsers(dest="bench", metavar="KIND")
    for info in sorted(pkgutil.iter_modules(bench_pkg.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"lowbit.bench.{info.name}")
        if hasattr(module, "register"):
            module.register(kinds)
    p.set_defaults(func=lambda args: p.print_help() or 2)
