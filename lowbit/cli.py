"""The ``lowbit`` command line.

Each subcommand lives in its own module under ``lowbit/commands/`` and exposes
``register(subparsers)``, which adds its parser and sets ``func`` to the function that runs it.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

import lowbit.commands as commands_pkg

DESCRIPTION = """lowbit: low-bit numbers for serving LLMs.

Quantize weights, activations and the KV cache of Hugging Face models (Atom-style W4A4 and
friends), measure what each number format costs in accuracy and bytes, and all-reduce
tensors in low precision over torch.distributed (the QuickReduce design).
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lowbit", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(commands_pkg.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"lowbit.commands.{info.name}")
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
