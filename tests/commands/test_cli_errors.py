"""Every expected error of every subcommand is one line on stderr, ``lowbit: error: ...``, exit
status 2, no traceback, found before any model is loaded where it can be."""

import json
import os
import re

import pytest
import torch

import lowbit.checkpoint
import lowbit.models
from lowbit.cli import main
from lowbit.checkpoint import CONFIG_NAME, save_quantized
from tests.tiny_models import tiny_model
from lowbit.quantize import get_scheme, quantize_model

# Per command: bad arguments and the pattern its one error line must match; a bare string is a bad
# value whose error only has to name its flag (the first word).
BAD_ARGUMENTS = {
    "quantize": [
        ("--set weights.bits=1", r"weights.bits must be one of"),
        ("--set weights.bits=9", r"weights.bits must be one of"),
        ("--set weights.bits=0", r"weights.bits must be one of"),
        ("--set weights.bits=-3", r"weights.bits must be one of"),
        ("--set weights.bits=four", r"got 'four'"),
        ("--set weights.group_size=-1", r"group_size must be an integer >= 0"),
        ("--set weights.bogus=1", r"unknown field 'bogus'"),
        ("--set bits=4", r"must look like part.field=value"),
        ("--scheme w5a5", r"argument --scheme: invalid choice"),
        ("--samples 0", r"--samples: must be a positive integer, got 0"),
        ("--seqlen -1", r"--seqlen: must be a positive integer"),
        ("--tp 0", r"--tp: must be a positive integer"),
        ("--threads two", r"--threads: expected an integer"),
        ("--eval-windows -1", r"--eval-windows: must be an integer >= 0"),
        "--eval-seqlen 0",
        ("--bogus", r"unrecognized arguments: --bogus"),
    ],
    "formats": ["--samples 0", ("--seqlen x", r"--seqlen: expected an integer"), "--rows 0", "--top -1"],
    "eval ppl": [
        "--batch-size 0", "--seqlen 512 0", "--max-windows -1", "--tp 0",
        ("--dtype int8", r"--dtype: invalid choice"),
        ("--tp 2 --dtype bfloat16", r"--tp 2 runs in float32"),
        ("--dataset no-such-file.txt", r"unknown evaluation dataset"),
        ("--tp 2 --allreduce int4+x", r"--allreduce: unknown all-reduce 'int4\+x'.*unknown option '\+x'"),
        ("--tp 2 --allreduce fp+o16", r"--allreduce: .*the fp codec sends raw values"),
        ("--tp 2 --allreduce int4+o16 --outlier-channels some", r"--outlier-channels: invalid choice"),
    ],
    "eval zeroshot": [
        "--limit 0",
        ("--tasks hellaswag", r"unknown zero-shot task"),
        ("--tasks no-such-set.jsonl", r"zero-shot set not found: no-such-set.jsonl"),
    ],
    "eval kl": [("", r"the following arguments are required: --ref"), ("--ref default --top-k 0", r"--top-k")],
    "eval compare": [("missing-a.json missing-b.json", r"missing-a.json")],
    "bench allreduce": [
        ("--codecs int9", r"unknown codec 'int9'"),
        ("--codecs ,", r"--codecs: expected a comma list"),
        ("--sizes 1M..4K", r"bad size range '1M..4K'"),
        ("--sizes lots", r"not a byte size"),
        ("--timeout 0", r"--timeout: must be a positive number"),
        ("--timeout nan", r"--timeout: expected a finite number"),
        "--repeats 0",
        ("--world-size 1", r"--world-size must be >= 2"),
        ("--size-factor 1", r"--size-factor must be >= 2"),
        "--link-gbit 0", "--accuracy-elements -1",
    ],
    "bench codecs": ["--elements 0", ("--codecs bogus", r"unknown codec"), "--threads 0",
                     ("--codecs int4+h7", r"unknown option '\+h7'"), "--hidden 0"],
    "bench gemm": ["--batches 0", ("--kernels w9a9", r"--kernels 'w9a9'"), ("--shapes 3x", r"unknown shape '3x'"),
                   "--max-seconds 0"],
    "bench decode": [("--batches 1,,8", r"--batches: expected a comma list"), "--prompt 0",
                     ("--new 1", r"--new must be >= 2"), ("--formats int1", r"--formats int1")],
    "bench decode-split": ["--batch 0", ("--formats int1", r"--formats 'int1'")],
    "bench tp-decode": ["--tp 0", "--timeout 0", ("--allreduce none int4+o0", r"--allreduce: .*at least one")],
    "tune allreduce": [
        ("--world-sizes 1", r"world sizes must be >= 2"), "--world-sizes 2,x",
        ("--codecs bogus", r"unknown codec"), ("--sizes x", r"not a byte size"),
        "--timeout 0", "--repeats 0", ("--dtypes int8", r"unknown dtype 'int8'"),
    ],
    "export": [
        ("no-such-checkpoint", r"the following arguments are required: --out"),
        ("--format onnx x --out y", r"--format: invalid choice: 'onnx'"),
        ("--kv-cache int4 x --out y", r"--kv-cache: invalid choice"),
        ("no-such-checkpoint --out fresh-export-dir", r"is not a lowbit checkpoint"),
    ],
    "env": [("--bogus", r"unrecognized arguments: --bogus"), ("--json /proc/no-such/env.json", r"/proc/no-such")],
    "nope": [("", r"invalid choice: 'nope'")],
}
PARSE_ERRORS = [(command.split() + (case if isinstance(case, str) else case[0]).split(),
                 re.escape(case.split()[0]) if isinstance(case, str) else case[1])
                for command, cases in BAD_ARGUMENTS.items() for case in cases]


@pytest.fixture
def no_model(monkeypatch):
    """Fail the test if a command gets as far as loading a model."""
    def refuse(*a, **k):
        raise AssertionError("a model was loaded before the arguments were checked")

    monkeypatch.setattr(lowbit.checkpoint, "load_model", refuse)
    monkeypatch.setattr(lowbit.models.loading, "_default_cached_dir", refuse)


def fails(capsys, argv, pattern):
    capsys.readouterr()  # drop what the test's own setup printed
    rc = main(argv)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 2, (argv, err)
    assert len(lines) == 1 and lines[0].startswith("lowbit: error: "), (argv, err)
    assert "Traceback" not in err and re.search(pattern, lines[0]), (argv, lines[0])
    return lines[0]


@pytest.mark.parametrize("argv,pattern", PARSE_ERRORS, ids=[" ".join(a) for a, _ in PARSE_ERRORS])
def test_bad_argument_is_one_line(capsys, no_model, argv, pattern):
    fails(capsys, argv, pattern)


def test_debug_shows_the_traceback(no_model):
    from lowbit.quantize import SchemeError

    with pytest.raises(SchemeError):
        main(["--debug", "quantize", "--set", "weights.bits=9"])


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    model = tiny_model("llama")
    quantize_model(model, get_scheme("w4a4-rtn"), torch.randint(0, 128, (1, 16)), progress=False)
    return save_quantized(model, tmp_path_factory.mktemp("cli") / "q")


def _read_only(path, monkeypatch):
    """A folder this process cannot write in (root ignores modes, so it is told so by os.access)."""
    path.mkdir(exist_ok=True)
    path.chmod(0o555)
    if os.geteuid() == 0:
        real = os.access
        monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if (mode & os.W_OK and os.path.abspath(p) == str(path))
                            else real(p, mode, **kw))
    return path


def test_output_paths_are_checked_before_any_work(capsys, no_model, tmp_path, monkeypatch, ckpt):
    (tmp_path / "file").write_text("x")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "a.txt").write_text("x")
    ro = _read_only(tmp_path / "ro", monkeypatch)
    cases = [
        (["quantize", "--out", str(tmp_path / "file")], r"is a file"),
        (["quantize", "--out", str(tmp_path / "mine")], r"not a lowbit checkpoint"),
        (["quantize", "--out", str(ro / "q")], r"cannot write in"),
        (["quantize", "--json", str(tmp_path)], r"--json .* is a folder"),
        (["quantize", "--json", str(ro / "r.jsonl")], r"cannot write in"),
        (["quantize", "--reference", str(tmp_path)], r"--reference .* is a folder"),
        (["eval", "ppl", "--json", str(ro / "r.json")], r"cannot write in"),
        (["eval", "kl", "--ref", "default", "--save-ref", str(tmp_path)], r"--save-ref .* is a folder"),
        (["formats", "--plot", str(ro / "p.png")], r"--plot"),
        (["bench", "codecs", "--out", str(tmp_path / "file")], r"--out .* is a file"),
        (["bench", "allreduce", "--out", str(ro)], r"cannot write in"),
        (["bench", "gemm", "--out", str(tmp_path / "file")], r"is a file"),
        (["bench", "decode", "--out", str(tmp_path / "file")], r"is a file"),
        (["tune", "allreduce", "--out", str(tmp_path)], r"is a folder"),
    ]
    for argv, pattern in cases:
        fails(capsys, argv, pattern)
    (ckpt / "NOTES.md").write_text("mine")
    try:
        fails(capsys, ["quantize", "--out", str(ckpt)], r"holds files lowbit did not write \(NOTES.md\)")
    finally:
        (ckpt / "NOTES.md").unlink()
    monkeypatch.chdir(ckpt)
    fails(capsys, ["quantize", "--out", "."], r"is the working directory")


def test_inputs_that_cannot_be_used(capsys, tmp_path, monkeypatch, ckpt):
    from transformers import GPT2Config, GPT2LMHeadModel

    text = tmp_path / "t.txt"
    text.write_text("hello world " * 50)
    ev = ["--dataset", str(text), "--seqlen", "8", "--max-windows", "1", "--no-progress"]
    fails(capsys, ["quantize", str(ckpt)], r"already a lowbit-quantized checkpoint")
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64)).save_pretrained(tmp_path / "gpt2")
    fails(capsys, ["quantize", str(tmp_path / "gpt2")], r"got model_type='gpt2'")
    fails(capsys, ["eval", "ppl", "--model", str(ckpt), *ev], r"has no tokenizer")
    fails(capsys, ["eval", "ppl", "--model", str(ckpt), "--dtype", "bfloat16", *ev], r"runs in float32")
    torch.save({"w": torch.zeros(2)}, tmp_path / "model.pkl")
    fails(capsys, ["eval", "ppl", "--model", str(tmp_path / "model.pkl"), *ev], r"model.pkl is a file")
    fails(capsys, ["eval", "kl", "--ref", str(tmp_path / "model.pkl"), "--model", str(ckpt), *ev], r"is a file")
    fails(capsys, ["eval", "ppl", "--model", str(tmp_path / "no" / "such"), *ev], r"no model directory")
    meta = json.loads((ckpt / CONFIG_NAME).read_text())
    bad = tmp_path / "bad"
    bad.mkdir()
    for p in ckpt.iterdir():
        (bad / p.name).write_bytes(p.read_bytes())
    meta["layout"]["bogus"] = {}
    (bad / CONFIG_NAME).write_text(json.dumps(meta))
    fails(capsys, ["eval", "ppl", "--model", str(bad), *ev], r"edited after saving")
    monkeypatch.setenv("LOWBIT_TRUST_EDITED_CHECKPOINT", "1")
    fails(capsys, ["eval", "ppl", "--model", str(bad), *ev], r"unknown layout key")
    monkeypatch.setenv("LOWBIT_DATA", str(tmp_path / "no-data"))
    fails(capsys, ["quantize", "--samples", "2"], r"data file 'wikitext2/wiki.valid.tokens' not found")
