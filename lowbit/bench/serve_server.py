"""A benchmarked process tree: started in its own session, health-checked with a time limit, its
resident memory sampled, its CPU time split by process, and stopped as a whole process group so
nothing outlives the benchmark.

``vllm serve`` forks an engine-core process (and more with parallelism); the tree's memory is the
sum of every member's RSS (shared pages such as the mapped weights count once per process that
maps them: an upper bound, what ``top`` would add up).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from lowbit.errors import LowbitError

LOG_TAIL_CHARS = 3000


class ServerFailed(LowbitError, RuntimeError):
    """A benchmarked server exited, never became healthy, or would not stop (with its log's tail)."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now (the OS picks; the server binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def log_tail(path: Path, chars: int = LOG_TAIL_CHARS) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return "(no log)"
    return data[-chars:].decode("utf-8", "replace")


def _tree(pid: int) -> list:
    """``pid``'s process and all its descendants (psutil), [] once it is gone."""
    import psutil

    try:
        root = psutil.Process(pid)
        return [root] + root.children(recursive=True)
    except psutil.Error:
        return []


def tree_rss(pid: int) -> tuple[int, list[int]]:
    """(sum of RSS bytes, pids) of ``pid`` and all its descendants; processes that vanish mid-walk are skipped."""
    import psutil

    total, pids = 0, []
    for p in _tree(pid):
        try:
            total += p.memory_info().rss
            pids.append(p.pid)
        except psutil.Error:
            pass
    return total, pids


def tree_cpu(pid: int) -> dict[int, tuple[str, dict[int, float]]]:
    """{pid: (name, {thread id: CPU seconds so far, user + system})} of ``pid`` and its descendants;
    processes that vanish mid-walk are skipped."""
    import psutil

    out = {}
    for p in _tree(pid):
        try:
            out[p.pid] = ("server" if p.pid == pid else p.name(), {t.id: t.user_time + t.system_time for t in p.threads()})
        except psutil.Error:
            pass
    return out


def cpu_split(before: dict, after: dict, min_thread_s: float = 0.05) -> tuple[dict[str, float], dict[str, list[float]]]:
    """CPU seconds the tree used between two :func:`tree_cpu` samples, by process name (vLLM names
    its engine core and workers; the root is ``server``), largest first, and each name's threads
    that used ``min_thread_s`` or more, largest first (a kernel library's own pool shows up as a
    thread beside the OpenMP team's). A process or thread started in between counts from zero; one
    gone by ``after`` is not counted."""
    procs: dict[str, float] = {}
    threads: dict[str, list[float]] = {}
    for pid, (name, ts) in after.items():
        old = before.get(pid, (name, {}))[1]
        used = [t - old.get(tid, 0.0) for tid, t in ts.items()]
        procs[name] = procs.get(name, 0.0) + sum(used)
        threads.setdefault(name, []).extend(round(u, 3) for u in used if u >= min_thread_s)
    order = sorted(procs, key=lambda n: -procs[n])
    return {n: round(procs[n], 3) for n in order}, {n: sorted(threads[n], reverse=True) for n in order}


class PeakTreeRSS:
    """Samples :func:`tree_rss` of a process in a thread; ``peak`` is the largest sum seen."""

    def __init__(self, pid: int, interval: float = 0.05):
        self.pid, self.interval, self.peak, self.pids = pid, interval, 0, set()

    def _sample(self):
        total, pids = tree_rss(self.pid)
        self.peak = max(self.peak, total)
        self.pids.update(pids)

    def _loop(self):
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self):
        self._stop = threading.Event()
        self._sample()
        self._t = threading.Thread(target=self._loop, daemon=True)
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        self._sample()


class ServerProcess:
    """``argv`` run in its own session (so its process group is the whole tree), output to ``log``."""

    def __init__(self, argv: list[str], log: Path, env: dict | None = None, name: str = "server"):
        self.argv, self.log, self.env, self.name = argv, Path(log), env, name
        self.proc: subprocess.Popen | None = None
        self.seen_pids: set[int] = set()

    def start(self) -> "ServerProcess":
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=self.env, start_new_session=True)
        return self

    def failed(self, what: str) -> ServerFailed:
        return ServerFailed(f"{self.name} {what}; its log ({self.log}) ends:\n{log_tail(self.log)}")

    def wait_healthy(self, url: str, timeout: float, poll: float = 0.5) -> float:
        """Seconds until ``url`` answers 200; the server is stopped and its log's tail raised if it
        exits first or takes longer than ``timeout``."""
        t0 = time.perf_counter()
        while True:
            if self.proc.poll() is not None:
                self.stop()
                raise self.failed(f"exited with code {self.proc.returncode} before it was healthy")
            try:
                with urllib.request.urlopen(url, timeout=5) as r:
                    if r.status == 200:
                        return time.perf_counter() - t0
            except (urllib.error.URLError, OSError):
                pass
            self.seen_pids.update(tree_rss(self.proc.pid)[1])
            if time.perf_counter() - t0 > timeout:
                self.stop()
                raise self.failed(f"was not healthy at {url} within {timeout:.0f} s")
            time.sleep(poll)

    def wait(self, timeout: float) -> int:
        """Wait for a process that ends by itself (a job, not a server); stopped and raised past ``timeout``."""
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            raise self.failed(f"ran past {timeout:.0f} s") from None
        return self.stop()  # its children too

    def alive_pids(self) -> list[int]:
        """The pids seen in this server's tree that still exist (empty once it has stopped)."""
        import psutil

        return sorted(p for p in self.seen_pids if psutil.pid_exists(p) and _not_zombie(p))

    def stop(self, grace: float = 30.0) -> int:
        """SIGTERM to the whole process group, SIGKILL after ``grace`` seconds; returns the exit code.
        Raises :class:`ServerFailed` if any process of the tree is still alive afterwards."""
        if self.proc is None:
            return 0
        self.seen_pids.update(tree_rss(self.proc.pid)[1])
        pgid = self.proc.pid  # start_new_session: the leader's pid is the group id
        _signal_group(pgid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while (self.proc.poll() is None or self.alive_pids()) and time.monotonic() < deadline:
            time.sleep(0.1)  # vLLM's API server stops its engine core itself on SIGTERM
        if self.proc.poll() is None or self.alive_pids():
            _signal_group(pgid, signal.SIGKILL)
            for pid in self.alive_pids():  # a member that left the group (setsid) is still ours
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self.proc.wait(timeout=grace)
        end = time.monotonic() + 10
        while self.alive_pids() and time.monotonic() < end:
            time.sleep(0.1)
        if self.alive_pids():
            raise self.failed(f"left processes {self.alive_pids()} running after stop")
        return self.proc.returncode

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def _not_zombie(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
