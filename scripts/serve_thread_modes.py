"""``lowbit bench serve`` with lowbit's plugin formats under several kernel thread modes at once
(``LOWBIT_THREADS``, ``csrc/work_pool.h``): each mode is one more format, ``plugin-w4a4-omp`` for
example, whose server gets that mode in its environment, so ``--rounds`` drives every mode's server
in turn beside vLLM's own formats and a drifting machine moves them alike. The thread mode inside a
served engine is what this measures; an offline engine (``scripts/vllm_threads_ab.py``) has no
engine process spinning on the worker's results beside it.

    .venv/bin/python scripts/serve_thread_modes.py [--modes auto,omp] [--plugin plugin-w4a4] \\
        [--others w8a8] -- --concurrency 16,64 --requests 128 --rounds 3 --vllm-only --out OUT

Everything after ``--`` goes to ``lowbit bench serve`` (not ``--formats``: this script builds it).
"""

from __future__ import annotations

import argparse
import sys

MODES = ("auto", "omp", "pool")


def variant_formats(plugin: list[str], modes: list[str]) -> list[str]:
    """Register ``<format>-<mode>`` for every plugin format and mode; their names."""
    from lowbit.bench.serve_formats import FORMATS, PLUGIN, register_variant

    for name in plugin:
        if name not in FORMATS or FORMATS[name].vllm_args != PLUGIN:
            raise SystemExit(f"--plugin {name}: not one of lowbit's plugin formats")
    for mode in modes:
        if mode not in MODES:
            raise SystemExit(f"--modes {mode}: choose from {', '.join(MODES)}")
    return [register_variant(name, mode, {"LOWBIT_THREADS": mode}).name for name in plugin for mode in modes]


def main(argv: list[str]) -> int:
    ours, rest = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modes", default="auto,omp", help="comma list of auto, omp, pool")
    ap.add_argument("--plugin", default="plugin-w4a4", help="comma list of plugin formats to run in every mode")
    ap.add_argument("--others", default="w8a8", help="comma list of formats run once beside them ('' for none)")
    args = ap.parse_args(ours)
    if "--formats" in rest:
        raise SystemExit("--formats is built by this script: use --plugin and --others")
    split = lambda s: [x for x in s.split(",") if x]  # noqa: E731
    formats = split(args.others) + variant_formats(split(args.plugin), split(args.modes))
    from lowbit.cli import main as lowbit_main

    return lowbit_main(["bench", "serve", "--formats", ",".join(formats), *rest])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
