"""argparse ``type=`` checkers, so a bad value fails while parsing (one line, exit 2), before
any model is loaded."""

from __future__ import annotations

import argparse
import math


def _number(kind, text: str):
    try:
        v = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}, got {text!r}") from None
    if isinstance(v, float) and not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return v


def _at_least(kind, low, strict: bool, what: str):
    """A checker for numbers of ``kind`` above ``low`` (``strict``) or from ``low`` on."""
    def check(text: str):
        v = _number(kind, text)
        if v < low or (strict and v == low):
            raise argparse.ArgumentTypeError(f"must be {what}, got {v:g}")
        return v

    check.__name__ = what.replace(" ", "_")  # argparse names the type in its messages
    return check


positive_int = _at_least(int, 0, True, "a positive integer")
nonneg_int = _at_least(int, 0, False, "an integer >= 0")
positive_float = _at_least(float, 0.0, True, "a positive number")


def int_list(text: str) -> str:
    """A comma list of positive integers ('1,8,32'), kept as the text the commands split."""
    parts = [p.strip() for p in text.split(",")]
    if not all(parts):
        raise argparse.ArgumentTypeError(f"expected a comma list of positive integers, got {text!r}")
    for part in parts:
        positive_int(part)
    return text


def codec_list(text: str) -> str:
    """A comma list of all-reduce codec names, each known, options allowed (``int4+h``; kept as the
    text the commands parse)."""
    from lowbit.comm.codecs import parse_spec

    names = [c.strip() for c in text.split(",") if c.strip()]
    if not names:
        raise argparse.ArgumentTypeError("expected a comma list of codec names")
    for c in names:
        try:
            parse_spec(c)
        except (KeyError, ValueError) as e:
            raise argparse.ArgumentTypeError(" ".join(str(e.args[0] if e.args else e).split())) from None
    return text


def allreduce_name(text: str) -> str:
    """"plain" or an all-reduce codec with its options (``int4+h+o16``), in canonical form."""
    from lowbit.parallel.layers import parse_allreduce

    try:
        return parse_allreduce(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(" ".join(str(e).split())) from None


def decode_method(text: str) -> str:
    """``lowbit bench tp-decode --allreduce``: "none" or an all-reduce name (:func:`allreduce_name`)."""
    return text if text == "none" else allreduce_name(text)


def size_list(text: str) -> str:
    """Message sizes ('4K..256M' or '4K,1M'), checked here, kept as text for the commands."""
    from lowbit.bench.allreduce import parse_sizes

    try:
        sizes = parse_sizes(text)
    except (KeyError, ValueError) as e:
        raise argparse.ArgumentTypeError(" ".join(str(e.args[0] if e.args else e).split())) from None
    if not sizes or min(sizes) <= 0:
        raise argparse.ArgumentTypeError(f"expected positive sizes, got {text!r}")
    return text
