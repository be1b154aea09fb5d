"""``lowbit bench tp-decode``: decode tokens/s under tensor parallelism per all-reduce, unshaped
and on rate-limited links (the benchmark lives in :mod:`lowbit.comm.tp.decode_bench`)."""

from __future__ import annotations


def register(kinds) -> None:
    from lowbit.comm.tp.decode_bench import build_parser

    p = kinds.add_parser("tp-decode", help="TP decode tokens/s per all-reduce (plain, codecs), unshaped and shaped links")
    build_parser(p)
    p.set_defaults(func=_run)


def _run(args) -> int:
    from lowbit.comm.tp.decode_bench import run

    return run(args)
