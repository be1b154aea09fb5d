"""Errors a user can cause (bad arguments, missing or damaged files), told apart from bugs.

The command line prints these as one line (``lowbit: error: ...``, exit 2); anything else is a
bug and keeps its traceback. ``LowbitError`` is the base of lowbit's own error types.
"""

from __future__ import annotations


class LowbitError(Exception):
    """An expected failure with a message meant for the user."""


class UsageError(LowbitError, ValueError):
    """A command-line argument (or its combination with others) is invalid."""


class CheckpointError(LowbitError, RuntimeError):
    """A checkpoint is missing, truncated, corrupt, edited, or of an unknown format version."""


# What ``lowbit`` reports in one line: lowbit's errors, bad values, and file-system problems.
EXPECTED = (LowbitError, ValueError, OSError)


def one_line(e: BaseException) -> str:
    """The exception's message on one line (transformers' messages span several)."""
    text = " ".join(str(e).split()) or type(e).__name__
    return text if isinstance(e, (LowbitError, ValueError)) else f"{type(e).__name__}: {text}"
