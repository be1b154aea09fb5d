"""TP greedy decoding on a tiny random Llama at W=2 (6 heads / 3 KV heads: an uneven 2 + 1 KV-group
split): the KV-cache loop equals ``generate``; with plain all-reduce the split model generates
exactly the single-process tokens; the benchmark CLI writes its JSON; bad input fails early."""

import json
import os
import subprocess

import pytest
import torch

from lowbit.cli import main as cli_main
from lowbit.bench import tp_decode as decode_bench
from lowbit.bench.tp_decode_worker import CountingReducer, greedy_decode, matching_prefix, method_reducer
from tests.tiny_models import tiny_model

LAYERS = 2


def _can_make_netns() -> bool:
    from lowbit.bench.netns import NetnsError, check_can_shape

    try:
        check_can_shape()
    except NetnsError:
        return False
    name = f"lowbit-probe-{os.getpid()}"
    r = subprocess.run(["ip", "netns", "add", name], capture_output=True)
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return r.returncode == 0


SHAPED = _can_make_netns()  # root + iproute2 + permission to create a network namespace


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    model = tiny_model("llama", seed=1, num_attention_heads=6, num_key_value_heads=3, hidden_size=96,
                       num_hidden_layers=LAYERS)
    folder = tmp_path_factory.mktemp("tiny_llama")
    model.save_pretrained(folder)
    return model, folder


def test_greedy_loop_equals_generate(tiny):
    model, _ = tiny
    ids = torch.randint(0, 128, (3, 7), generator=torch.Generator().manual_seed(0))
    run = greedy_decode(model, ids, 6)
    model.generation_config.eos_token_id = None  # no early stop: compare all 6 tokens
    with torch.inference_mode():
        ref = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False,
                             pad_token_id=0)
    assert run.tokens.shape == (3, 6)
    assert torch.equal(run.tokens, ref[:, 7:])
    assert run.prefill_s > 0 and run.decode_s > 0


def test_tp_decode_cli_plain_equals_single_process(tiny, tmp_path):
    _, folder = tiny
    argv = ["bench", "tp-decode", "--model", str(folder), "--random-prompts", "--prompt", "6", "--new", "5", "--repeats", "1",
            "--batches", "1", "3", "--allreduce", "none", "plain", "int4", "--ref-threads", "1",
            "--out", str(tmp_path), *(["--link-gbit", "2"] if SHAPED else [])]
    links = ["unshaped", "2 Gbit/s"] if SHAPED else ["unshaped"]
    assert cli_main(argv) == 0  # `lowbit bench tp-decode` delegates to lowbit.bench.tp_decode
    data = json.loads((tmp_path / "tp_decode.json").read_text())
    assert (tmp_path / "tp_decode.png").stat().st_size > 0
    assert data["meta"]["plain_tokens_equal_single"] is True
    rows = {(r["link"], r["method"], r["batch"]): r for r in data["rows"]}
    assert set(rows) == {(lk, m, b) for lk in links for m in ("none", "plain", "int4") for b in (1, 3)}
    for (_, method, b), r in rows.items():
        assert r["allreduces_per_step"] == 2 * LAYERS  # o_proj and down_proj of every layer
        assert r["message_bytes"] == b * 96 * 4
        assert len(r["tokens"]) == b and all(len(t) == 5 for t in r["tokens"])
        assert r["tok_s"] > 0
        if method == "plain":
            assert r["token_match"] == 1.0 and r["match_prefix"] == 5.0 and r["ranks_agree"]
        if method == "int4":
            assert r["ranks_agree"] and r["allreduce_s"] > 0
    # without communication each rank sums only its own heads and rows: the comparison must see it
    assert rows[("unshaped", "none", 3)]["token_match"] < 1.0
    single = {r["batch"]: r for r in data["single_process"]}
    assert set(single) == {1, 3} and single[1]["threads"] == 1


def test_matching_prefix():
    assert matching_prefix([[1, 2, 3], [4, 5, 6]], [[1, 2, 3], [4, 0, 6]]) == (5 / 6, 2.0)
    with pytest.raises(ValueError, match="shapes differ"):
        matching_prefix([[1, 2]], [[1, 2, 3]])


def test_counting_reducer_and_methods():
    c = CountingReducer(lambda t: t * 2)
    assert torch.equal(c(torch.ones(2)), torch.full((2,), 2.0)) and c.calls == 1
    assert torch.equal(method_reducer("none")(torch.ones(3)), torch.ones(3))
    with pytest.raises(ValueError, match="unknown all-reduce"):
        method_reducer("int5")
    with pytest.raises(ValueError, match="unknown policy"):
        method_reducer("int4", policy="sometimes")
    from lowbit.bench.tp_decode_worker import parse_method

    assert parse_method("INT4+o16+h") == "int4+h+o16" and parse_method("none") == "none"
    with pytest.raises(ValueError, match="unknown option"):
        parse_method("int4+q")


def test_greedy_bad_input(tiny):
    model, _ = tiny
    with pytest.raises(ValueError, match="non-empty"):
        greedy_decode(model, torch.zeros(1, 0, dtype=torch.long), 3)
    with pytest.raises(ValueError, match="non-empty"):
        greedy_decode(model, torch.zeros(4, dtype=torch.long), 3)
    with pytest.raises(TypeError, match="int64"):
        greedy_decode(model, torch.zeros(1, 4), 3)
    with pytest.raises(ValueError, match="n_new"):
        greedy_decode(model, torch.zeros(1, 4, dtype=torch.long), 0)


@pytest.mark.parametrize("extra, msg", [
    (["--tp", "7"], "no head"),  # 6 heads cannot go to 7 ranks
    (["--tp", "1"], "--tp must be >= 2"),
    (["--new", "1"], "--new >= 2"),
    (["--batches", "0"], "--batches: must be a positive integer"),
    (["--link-gbit", "0"], "--link-gbit: must be a positive number"),
    (["--skip-unshaped"], "needs at least one"),
])
def test_bad_arguments_fail_before_launch(tiny, tmp_path, monkeypatch, capsys, extra, msg):
    _, folder = tiny

    def no_launch(*a, **k):
        raise AssertionError("ranks were launched")

    monkeypatch.setattr(decode_bench, "measure_tp", no_launch)
    assert cli_main(["bench", "tp-decode", "--model", str(folder), "--random-prompts", "--out", str(tmp_path), *extra]) == 2
    assert msg in capsys.readouterr().err


def test_missing_model_folder_fails_cleanly(tmp_path, capsys):
    assert cli_main(["bench", "tp-decode", "--model", str(tmp_path / "missing"), "--out", str(tmp_path)]) == 2
    assert "error" in capsys.readouterr().err


def test_text_prompts_need_a_tokenizer(tiny, tmp_path, capsys, monkeypatch):
    _, folder = tiny
    monkeypatch.setattr(decode_bench, "measure_tp", lambda *a, **k: pytest.fail("ranks were launched"))
    assert cli_main(["bench", "tp-decode", "--model", str(folder), "--out", str(tmp_path)]) == 2
    assert "--random-prompts" in capsys.readouterr().err


def _torchrun(folder, out, *extra, timeout=240):
    """`lowbit bench tp-decode` as two torchrun ranks on this host (each process one rank)."""
    import sys

    from lowbit.parallel.launch import free_port

    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
           "--master-addr", "127.0.0.1", "--master-port", str(free_port()), "-m", "lowbit", "bench", "tp-decode",
           "--model", str(folder), "--prompt", "6", "--new", "4", "--repeats", "2", "--batches", "2",
           "--allreduce", "plain", "int4", "--ref-threads", "1", "--timeout", "60", "--out", str(out), *extra]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


def test_under_torchrun_each_process_is_one_rank(tiny, tmp_path):
    _, folder = tiny
    r = _torchrun(folder, tmp_path / "ok", "--random-prompts", "--link-label", "two test ranks")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    data = json.loads((tmp_path / "ok" / "tp_decode.json").read_text())
    assert data["meta"]["torchrun"] is True and data["meta"]["plain_tokens_equal_single"] is True
    assert data["meta"]["machine"]["cpu"]  # every number names its CPU
    rows = {(r["link"], r["method"]): r for r in data["rows"]}
    assert set(rows) == {("two test ranks", "plain"), ("two test ranks", "int4")}
    for r in rows.values():  # every rank generated the same tokens; plain equals the single process
        assert r["ranks_agree"] and r["allreduces_per_step"] == 2 * LAYERS and r["tok_s"] > 0 and r["tok_s_runs"] > 0
    assert rows[("two test ranks", "plain")]["token_match"] == 1.0
    # rank 0 failing before the ranks meet (no tokenizer for text prompts) fails the run, not a hang
    # (rank 1 raises the same error unless torchrun has already stopped it)
    bad = _torchrun(folder, tmp_path / "bad", timeout=120)
    assert bad.returncode != 0 and "--random-prompts" in bad.stderr, bad.stderr[-2000:]
    shaped = _torchrun(folder, tmp_path / "shaped", "--random-prompts", "--link-gbit", "2", timeout=120)
    assert shaped.returncode != 0 and "under torchrun the launcher's network is the link" in shaped.stderr


def test_step_stats_take_the_median_step():
    from lowbit.bench.tp_decode_worker import step_stats

    # two runs of 3 steps; one step interrupted (0.5 s): the median step ignores it, the runs do not
    s = step_stats(4, 4, [0.3, 0.7], [0.1, 0.1, 0.1, 0.1, 0.1, 0.5])
    assert s["step_ms"] == pytest.approx(100.0) and s["tok_s"] == pytest.approx(40.0)
    assert s["tok_s_runs"] == pytest.approx(4 * 3 / 0.5) and s["step_ms_mean"] == pytest.approx(1e3 * 1.0 / 6)


def test_greedy_run_times_each_step(tiny):
    model, _ = tiny
    run = greedy_decode(model, torch.zeros(2, 5, dtype=torch.long), 4)
    assert len(run.step_s) == 3 and all(t > 0 for t in run.step_s)
    assert sum(run.step_s) <= run.decode_s


def test_lockstep_decode_equals_each_method_alone(tiny):
    """Methods decoded step by step in turn give each method exactly its own greedy tokens."""
    from lowbit.bench.tp_decode_worker import lockstep_decode, paired_ratio

    model, _ = tiny
    ids = torch.randint(0, 128, (2, 5), generator=torch.Generator().manual_seed(3))
    scales = {"a": 1.0, "b": -1.0}  # two "methods": the LM head's weight as is or negated
    head = model.lm_head.weight.detach().clone()

    def use(m):
        model.lm_head.weight.data.copy_(head * scales[m])

    runs = lockstep_decode(model, ids, 5, ["a", "b"], use)
    for m in scales:
        use(m)
        alone = greedy_decode(model, ids, 5)
        assert torch.equal(runs[m].tokens, alone.tokens) and len(runs[m].step_s) == 4
    use("a")
    assert not torch.equal(runs["a"].tokens, runs["b"].tokens)  # the switch really took effect
    assert paired_ratio([2.0, 4.0, 6.0], [1.0, 4.0, 2.0]) == 2.0
    with pytest.raises(ValueError, match="match in number"):
        paired_ratio([1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="n_new must be >= 2"):  # no step to time
        lockstep_decode(model, ids, 1, ["a"], use)
    with pytest.raises(TypeError, match="int64"):
        lockstep_decode(model, ids.float(), 5, ["a"], use)
    with pytest.raises(ValueError, match="non-empty"):
        lockstep_decode(model, ids[:, :0], 5, ["a"], use)


def test_torchrun_world_size_must_match_tp(monkeypatch):
    from lowbit.parallel.launch import join_torchrun

    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(ValueError, match="--tp 2 but torchrun started 3 ranks"):
        join_torchrun(2, 10.0)
