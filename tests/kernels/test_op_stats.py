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
    ops.release(a), ops.release(b)


def test_off_unless_asked(monkeypatch):
    monkeypatch.delenv(op_stats.ENV, raising=False)
    assert op_stats.from_env() is None
    monkeypatch.setenv(op_stats.ENV, "/some/where.json")
    assert op_stats.from_env().path == "/some/where.json"
