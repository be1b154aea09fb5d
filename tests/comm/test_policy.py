"""Size policy: byte parsing, precedence (env > arguments > table > default), table files, cost model."""

import json
import math

import pytest
import torch

from lowbit.comm.costmodel import (
    CodecCost, LinkFit, PathFit, best_path, crossover_bytes, fit_link, fit_path, model_paths, oneshot_s, policy_window,
    quick_s,
)
from lowbit.comm.policy import (
    DEFAULT_MIN_BYTES, DEFAULT_TWOSHOT_MIN_BYTES, NO_MAX, SizePolicy, load_table, parse_bytes, save_table, table_key,
)


def test_parse_bytes():
    assert parse_bytes("4096") == 4096
    assert parse_bytes("4K") == 4096 and parse_bytes("256M") == 256 << 20 and parse_bytes("1.5KiB") == 1536
    assert parse_bytes("inf") == NO_MAX
    for bad in ("", "abc", "-1", "nan"):
        with pytest.raises(ValueError):
            parse_bytes(bad)


def test_precedence(monkeypatch):
    table = {table_key("int4", 2, torch.bfloat16): {"min_bytes": 5000, "max_bytes": 9000}}
    monkeypatch.delenv("LOWBIT_QR_MIN_BYTES", raising=False)
    monkeypatch.delenv("LOWBIT_QR_MAX_BYTES", raising=False)
    assert SizePolicy("int4", 2).window(torch.bfloat16) == (DEFAULT_MIN_BYTES, NO_MAX, "default")
    p = SizePolicy("int4", 2, table=table)
    assert p.window(torch.bfloat16) == (5000, 9000, "table")
    assert p.window(torch.float16)[2] == "default"  # other dtype: not in the table
    assert p.use_quick(6000, torch.bfloat16) and not p.use_quick(4000, torch.bfloat16) and not p.use_quick(9001, torch.bfloat16)
    assert SizePolicy("int4", 2, min_bytes=10, table=table).window(torch.bfloat16) == (10, 9000, "arguments")
    monkeypatch.setenv("LOWBIT_QR_MAX_BYTES", "1M")
    assert SizePolicy("int4", 2, min_bytes=10, table=table).window(torch.bfloat16) == (10, 1 << 20, "environment")
    monkeypatch.setenv("LOWBIT_QR_MIN_BYTES", "oops")
    with pytest.raises(ValueError, match="LOWBIT_QR_MIN_BYTES"):
        SizePolicy("int4", 2).window(torch.bfloat16)


def test_table_round_trip_and_bad_files(tmp_path):
    p = tmp_path / "t.json"
    assert load_table(p) == {}
    save_table({"int4/w2/bfloat16": {"min_bytes": 1, "max_bytes": 2}}, {"note": "x"}, p)
    assert load_table(p)["int4/w2/bfloat16"]["min_bytes"] == 1
    assert not list(tmp_path.glob("*.tmp*"))
    p.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_table(p)
    p.write_text(json.dumps({"meta": {}}))
    with pytest.raises(ValueError, match="entries"):
        load_table(p)


def test_cost_model_fit_and_crossover():
    link = LinkFit(alpha_s=1e-4, bus_bytes_per_s=1e9, world_size=2)
    sizes = [1e3, 1e5, 1e7]
    fit = fit_link(sizes, [link.plain_s(s) for s in sizes], 2)
    assert math.isclose(fit.alpha_s, 1e-4, rel_tol=1e-6) and math.isclose(fit.bus_bytes_per_s, 1e9, rel_tol=1e-6)
    cost = CodecCost(1e-10, 1e-10)
    x = crossover_bytes(2, 3.56, link, cost)
    assert 0 < x < math.inf
    assert math.isclose(quick_s(x, 2, 3.56, link, cost), link.plain_s(x), rel_tol=1e-6)
    assert quick_s(10 * x, 2, 3.56, link, cost) < link.plain_s(10 * x)
    slow = CodecCost(1e-6, 1e-6)  # compute dearer than the link saving: never quantize
    assert crossover_bytes(2, 3.56, link, slow) == math.inf
    assert crossover_bytes(2, 3.56, link, slow, pipelined=False) == math.inf


def test_cost_model_pipelined_is_the_slower_of_wire_and_compute():
    link = LinkFit(alpha_s=1e-4, bus_bytes_per_s=2.5e8, world_size=2)
    cost = CodecCost(2e-10, 1e-10)
    s = 64 << 20
    wire = s / (3.56 * 2.5e8)
    compute = s / 2 * (2e-10 * 1.5 + 2e-10)
    assert math.isclose(quick_s(s, 2, 3.56, link, cost), 3e-4 + max(wire, compute), rel_tol=1e-9)
    assert math.isclose(quick_s(s, 2, 3.56, link, cost, pipelined=False), 3e-4 + wire + compute, rel_tol=1e-9)
    x_pipe = crossover_bytes(2, 3.56, link, cost)
    x_serial = crossover_bytes(2, 3.56, link, cost, pipelined=False)
    assert 0 < x_pipe < x_serial < math.inf  # overlap can only make quick win earlier
    assert math.isclose(quick_s(x_pipe, 2, 3.56, link, cost), link.plain_s(x_pipe), rel_tol=1e-6)
    with pytest.raises(ValueError):
        fit_link([1.0], [1.0], 2)


def test_path_choice_and_its_precedence(monkeypatch):
    monkeypatch.delenv("LOWBIT_QR_TWOSHOT_MIN_BYTES", raising=False)
    table = {table_key("int4", 2, torch.bfloat16): {"min_bytes": 100, "max_bytes": 10000, "twoshot_min_bytes": 1000}}
    p = SizePolicy("int4", 2, table=table)
    assert [p.path(b, torch.bfloat16) for b in (99, 100, 999, 1000, 10000, 10001)] == [
        "plain", "oneshot", "oneshot", "twoshot", "twoshot", "plain"]
    assert SizePolicy("int4", 2, min_bytes=0).twoshot_from(torch.bfloat16) == DEFAULT_TWOSHOT_MIN_BYTES
    assert SizePolicy("int4", 2, table=table, twoshot_min_bytes=0).path(100, torch.bfloat16) == "twoshot"
    monkeypatch.setenv("LOWBIT_QR_TWOSHOT_MIN_BYTES", "inf")
    assert SizePolicy("int4", 2, table=table, twoshot_min_bytes=0).path(5000, torch.bfloat16) == "oneshot"


def test_decided_paths_are_remembered_until_the_environment_changes(monkeypatch):
    for name in ("LOWBIT_QR_MIN_BYTES", "LOWBIT_QR_MAX_BYTES", "LOWBIT_QR_TWOSHOT_MIN_BYTES"):
        monkeypatch.delenv(name, raising=False)
    table = {table_key("int4", 2, torch.float32): {"min_bytes": 100, "max_bytes": 10000, "twoshot_min_bytes": 1000}}
    p = SizePolicy("int4", 2, table=table)
    assert p.path(2304, torch.float32) == "twoshot"
    table.clear()  # the decision is kept: the table is not read again for this size
    assert p.path(2304, torch.float32) == "twoshot" and p.path(50, torch.float32) == "plain"
    monkeypatch.setenv("LOWBIT_QR_MIN_BYTES", "0")  # an environment override still counts at once
    assert p.path(2304, torch.float32) == "oneshot"
    monkeypatch.setenv("LOWBIT_QR_MIN_BYTES", "oops")
    with pytest.raises(ValueError, match="LOWBIT_QR_MIN_BYTES"):
        p.path(2304, torch.float32)


def test_oneshot_model_terms():
    link = LinkFit(alpha_s=1e-4, bus_bytes_per_s=1e9, world_size=4)
    cost = CodecCost(2e-10, 1e-10)
    s = 1 << 20
    expect = 1e-4 + 3 * s / (3.56 * 1e9) + s / 2 * (2e-10 + 4 * 1e-10)
    assert math.isclose(oneshot_s(s, 2, 3.56, link, cost), expect, rel_tol=1e-12)
    assert math.isclose(oneshot_s(s, 2, 3.56, link, cost, metadata=True), expect + 1e-4, rel_tol=1e-12)
    lines = model_paths(2, 3.56, link, cost)
    for name, f in (("plain", link.plain_s(s)), ("oneshot", expect),
                    ("twoshot", quick_s(s, 2, 3.56, link, cost, metadata=False))):
        assert math.isclose(lines[name].seconds(s), f, rel_tol=1e-9)
    assert lines["twoshot"].alpha_s == pytest.approx(2e-4) and lines["oneshot"].alpha_s == pytest.approx(1e-4)


def test_fit_path_recovers_a_line_and_refuses_too_few_points():
    sizes = [4096.0, 65536.0, 1 << 20, 16 << 20]
    fit = fit_path(sizes, [3e-5 + 2e-9 * s for s in sizes])
    assert math.isclose(fit.alpha_s, 3e-5, rel_tol=1e-6) and math.isclose(fit.s_per_byte, 2e-9, rel_tol=1e-6)
    for bad in (([1.0], [1.0]), ([1.0, 1.0], [1.0, 2.0]), ([1.0, 2.0], [0.0, 1.0])):
        with pytest.raises(ValueError):
            fit_path(*bad)


def test_policy_window_follows_the_lower_envelope():
    P = PathFit
    win = policy_window({"plain": P(1e-4, 1e-9), "oneshot": P(1.2e-4, 0.4e-9), "twoshot": P(2e-4, 0.3e-9)}, NO_MAX)
    assert win == {"min_bytes": 33334, "max_bytes": NO_MAX, "twoshot_min_bytes": 800000}
    never = policy_window({"plain": P(1e-4, 1e-9), "oneshot": P(1.2e-4, 2e-9), "twoshot": P(2e-4, 2e-9)}, NO_MAX)
    assert never["min_bytes"] == NO_MAX  # both quantized paths slower everywhere: always plain
    small = policy_window({"plain": P(1e-4, 1e-9), "oneshot": P(0.5e-4, 2e-9), "twoshot": P(2e-4, 2e-9)}, NO_MAX)
    assert small == {"min_bytes": 0, "max_bytes": 50000, "twoshot_min_bytes": NO_MAX}
    # every size: the policy's path is the envelope's
    lines = {"plain": P(1e-4, 1e-9), "oneshot": P(1.2e-4, 0.4e-9), "twoshot": P(2e-4, 0.3e-9)}
    pol = SizePolicy("int4", 2, table={table_key("int4", 2, torch.bfloat16): policy_window(lines, NO_MAX)})
    for b in (0, 1000, 33333, 33335, 10**5, 799999, 800001, 10**9):
        assert pol.path(b, torch.bfloat16) == best_path(b, lines), b
