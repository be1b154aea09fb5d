"""Benchmarks. A module here that defines ``register(subparsers)`` becomes ``lowbit bench NAME``."""
