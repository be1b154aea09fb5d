import json
import time

import torch

from lowbit.kernels import op_stats, ops
from lowbit.kernels.dispatch import prepare
from lowbit.kernels.linear_params import from_float


def test_the_op_times_itself_into_the_file_the_variable_names(tmp_path, monkeypatch):
    path = tmp_path / "stats.json"
    stats = op_stats.OpStats(str(path))
    monkeypatch.setattr(op_stats, "STATS", stats)
    a = ops.register(prepare(from_float(torch.randn(32, 64), "w8a8"), "cpu"))
    b = ops.register(prepare(from_float(torch.randn(16, 32), "w8a8"), "cpu"))
    x = torch.randn(3, 5, 64)
    for _ in range(4):  # a "forward": a then b
        y = ops.linear(x, a)
        assert torch.equal(y, ops.prepared(a).batched(x))  # timing changes nothing
        ops.linear(y, b)
    deadline = time.monotonic() + 5
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(2 * op_stats.INTERVAL_S)
    got = json.loads(path.read_text())
    assert got["calls"] == 8 and got["tokens"] == 8 * 15 and got["forwards"] == 4 and got["first_handle"] == a
    assert got["seconds"] > 0 and got == stats.snapshot()
    assert set(got["by_tokens"]) == {"9-32"}  # every call here has 15 tokens
    secs, calls, tokens = got["by_tokens"]["9-32"]
    assert calls == 8 and tokens == 8 * 15 and abs(secs - got["seconds"]) < 1e-9
    ops.release(a), ops.release(b)


def test_off_unless_asked(monkeypatch):
    monkeypatch.delenv(op_stats.ENV, raising=False)
    assert op_stats.from_env() is None
    monkeypatch.setenv(op_stats.ENV, "/some/where.json")
    assert op_stats.from_env().path == "/some/where.json"


def test_token_ranges_cover_every_count_once():
    names = [op_stats.token_range(t) for t in (1, 2, 8, 9, 32, 33, 128, 129, 512, 513, 10 ** 6)]
    assert names == ["1", "2-8", "2-8", "9-32", "9-32", "33-128", "33-128", "129-512", "129-512", "513+", "513+"]
