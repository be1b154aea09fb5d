"""The ``lowbit`` command line.

Each subcommand lives in its own module under ``lowbit/commands/`` and exposes
``register(subparsers)``, which adds its parser and sets ``func`` to the function that runs it.
Every expected error (a bad argument, a missing or damaged file: ``lowbit.errors.EXPECTED``) is
one line on stderr, ``lowbit: error: ...``, exit status 2; ``lowbit --debug`` shows its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

import lowbit.commands as commands_pkg
from lowbit.errors import EXPECTED, UsageError, one_line

DESCRIPTION = """lowbit: low-bit numbers for serving LLMs.

Quantize weights, activations and the KV cache of Hugging Face models (Atom-style W4A4 and
friends), measure what each number format costs in accuracy and bytes, and all-reduce
tensors in low precision over torch.distributed (the QuickReduce design).
"""


class Parser(argparse.ArgumentParser):
    """Parse errors become :class:`UsageError` (one line via ``main``) instead of usage + exit."""

    def error(self, message: str):
        where = self.prog.removeprefix("lowbit").strip()
        raise UsageError(f"{where}: {message}" if where else message)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="lowbit", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error instead of one line")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(commands_pkg.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"lowbit.commands.{info.name}")
        if hasattr(module, "register"):
            module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv[:1]
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        if not getattr(args, "func", None):
            parser.print_help()
            return 2
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except EXPECTED as e:
        if debug:
            raise
        print(f"lowbit: error: {one_line(e)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
