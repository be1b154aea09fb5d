"""A rate-limited link for the benchmark: a private network namespace whose loopback is shaped.

All ranks talk over 127.0.0.1, so shaping ``lo`` inside a fresh namespace (``tc`` token bucket)
turns one host into the network-bound regime of a multi-host cluster without touching the
host's own network. Needs root and iproute2 (``ip``, ``tc``). The namespace is removed afterwards,
even on error. Note: both directions share the one shaped ``lo`` queue.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator

from lowbit.errors import LowbitError


class NetnsError(LowbitError, RuntimeError):
    """The shaped link cannot be set up (not root, no iproute2, kernel refused)."""


def _run(cmd: list[str]) -> None:
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise NetnsError(f"`{' '.join(cmd)}` failed ({r.returncode}): {r.stderr.strip() or r.stdout.strip()}")


def check_can_shape() -> None:
    if os.geteuid() != 0:
        raise NetnsError("--link-gbit needs root (it creates a network namespace and a tc qdisc); run as root or drop the option")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise NetnsError(f"--link-gbit needs `{tool}` from iproute2 (Debian: apt-get install -y iproute2)")


def tc_args(gbit: float) -> list[str]:
    """Token bucket at ``gbit`` Gbit/s; burst of ~4 ms of traffic (at least 2 loopback MTUs)."""
    if not gbit > 0:
        raise ValueError(f"link rate must be > 0 Gbit/s, got {gbit}")
    rate_bytes = gbit * 1e9 / 8
    burst = max(int(rate_bytes * 0.004), 2 * 65536 + 1024)
    return ["tbf", "rate", f"{gbit}gbit", "burst", str(burst), "latency", "2s"]


@contextlib.contextmanager
def shaped_namespace(gbit: float, name: str | None = None) -> Iterator[list[str]]:
    """Yield the command prefix that runs a program inside the shaped namespace."""
    check_can_shape()
    ns = name or f"lowbit-qr-{os.getpid()}"
    _run(["ip", "netns", "add", ns])
    try:
        _run(["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"])
        _run(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "lo", "root", *tc_args(gbit)])
        yield ["ip", "netns", "exec", ns]
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
