import json

import pytest

from lowbit.data import DataNotFoundError
from lowbit.data.zeroshot import TASKS, UnknownTaskError, canonical_task, load_task, parse_item

SIZES = {"piqa": 1838, "arc_easy": 2376, "arc_challenge": 1172, "boolq": 3270, "winogrande": 1267, "lambada_openai": 5153}


@pytest.mark.parametrize("task", TASKS)
def test_every_task_reads(task):
    items = load_task(task, limit=5)
    assert len(items) == 5
    for it in items:
        assert 0 <= it.gold < len(it.pairs)
        assert all(cont.startswith(" ") and not cont.startswith("  ") for _, cont in it.pairs)


def test_full_sizes():
    assert {t: len(load_task(t)) for t in TASKS} == SIZES


def test_formats():
    arc = parse_item("arc_easy", {"query": "Question: Why?", "choices": ["a", "bb"], "gold": 1})
    assert arc.pairs == (("Question: Why?\nAnswer:", " a"), ("Question: Why?\nAnswer:", " bb")) and arc.choice_texts == ("a", "bb")
    piqa = parse_item("piqa", {"query": "Question: How?\n", "choices": ["x", "y"], "gold": 0})
    assert piqa.pairs[0] == ("Question: How?\nAnswer:", " x")
    wg = parse_item("winogrande", {"context_options": ["A so A", "A so B"], "continuation": "won.", "gold": 1})
    assert wg.pairs == (("A so A", " won."), ("A so B", " won.")) and wg.gold == 1
    lam = parse_item("lambada_openai", {"context": "he said to", "continuation": "her"})
    assert lam.pairs == (("he said to", " her"),) and lam.kind == "greedy"


def test_aliases_and_unknown():
    assert canonical_task("ARC-Easy") == "arc_easy" and canonical_task("lambada") == "lambada_openai"
    with pytest.raises(UnknownTaskError, match="known tasks"):
        canonical_task("hellaswag")


def test_malformed_input(tmp_path):
    with pytest.raises(ValueError, match="missing field"):
        parse_item("piqa", {"query": "q", "gold": 0})
    with pytest.raises(ValueError, match="out of range"):
        parse_item("boolq", {"query": "q", "choices": ["no", "yes"], "gold": 2})
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"query": "q", "choices": ["a"], "gold": 0}\n{oops\n')
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        load_task("piqa", path=bad)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(ValueError, match="no items"):
        load_task("piqa", path=empty)
    with pytest.raises(FileNotFoundError):
        load_task("piqa", path=tmp_path / "missing.jsonl")
    with pytest.raises(ValueError, match="positive"):
        load_task("piqa", limit=0)


def test_missing_shared_file(monkeypatch, tmp_path):
    monkeypatch.setenv("LOWBIT_DATA", str(tmp_path))
    with pytest.raises(DataNotFoundError):
        load_task("piqa")
