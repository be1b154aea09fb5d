"""Errors of the quantized all-reduce: one type per failure a caller may want to tell apart."""

from lowbit.errors import LowbitError


class AllReduceError(LowbitError, RuntimeError):
    """The collective failed: a peer rank died, timed out or broke the connection."""


class MetadataMismatchError(ValueError):
    """Ranks called all_reduce with different sizes, dtypes, codecs or paths (raised on every rank)."""
