import json

import pytest

from lowbit.cli import main
from lowbit.eval.report import compare_rows, load_json, make_record, save_json


def _ppl_record(model, ppl):
    return make_record("ppl", model, [{"ppl": ppl, "nll": 3.0, "n_tokens": 10, "n_windows": 1, "seconds": 1.0, "dataset": "wikitext2", "seqlen": 2048}])


def test_save_load_compare(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    save_json(_ppl_record("fp", 30.0), a)
    save_json(_ppl_record("w4", 33.0), b)
    rows = compare_rows(load_json(a), load_json(b))
    assert ("wikitext2@2048", "ppl", 30.0, 33.0, 3.0) in rows
    assert main(["eval", "compare", str(a), str(b)]) == 0
    assert not list(tmp_path.glob(".tmp-*"))  # atomic writes leave no temp files


def test_compare_rejects_bad_files(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"hello": 1}))
    good = tmp_path / "good.json"
    save_json(_ppl_record("fp", 30.0), good)
    zs = tmp_path / "zs.json"
    save_json(make_record("zeroshot", "fp", [{"task": "piqa", "acc": 0.6, "acc_norm": 0.6}]), zs)
    assert main(["eval", "compare", str(bad), str(good)]) == 2
    assert main(["eval", "compare", str(other), str(good)]) == 2
    assert main(["eval", "compare", str(tmp_path / "missing.json"), str(good)]) == 2
    assert main(["eval", "compare", str(zs), str(good)]) == 2
    assert "cannot compare" in capsys.readouterr().err


@pytest.fixture()
def tiny_dir(tiny, tokenizer, tmp_path):
    path = tmp_path / "tiny"
    tiny.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def test_cli_ppl_and_kl_end_to_end(tiny, tokenizer, tiny_dir, text_file, tmp_path):
    from lowbit.eval.perplexity import perplexity

    out = tmp_path / "ppl.json"
    assert main(["eval", "ppl", "--model", tiny_dir, "--dataset", text_file, "--seqlen", "32", "--json", str(out), "--no-progress"]) == 0
    rec = load_json(out)
    assert rec["results"][0]["ppl"] == pytest.approx(perplexity(tiny, tokenizer, text_file, 32, progress=False).ppl, rel=1e-6)
    kl = tmp_path / "kl.json"
    assert main(["eval", "kl", "--ref", tiny_dir, "--model", tiny_dir, "--dataset", text_file, "--seqlen", "32", "--max-windows", "2", "--json", str(kl), "--no-progress"]) == 0
    assert load_json(kl)["results"][0]["top1_agreement"] == 1.0


def test_cli_zeroshot_and_errors(tiny_dir, text_file, tmp_path, capsys):
    out = tmp_path / "zs.json"
    assert main(["eval", "zeroshot", "--model", tiny_dir, "--tasks", "boolq", "--limit", "3", "--json", str(out), "--no-progress"]) == 0
    assert load_json(out)["results"][0]["n_items"] == 3
    assert main(["eval", "zeroshot", "--model", tiny_dir, "--tasks", "hellaswag"]) == 2
    assert "unknown zero-shot task" in capsys.readouterr().err
    assert main(["eval", "ppl", "--model", tiny_dir, "--dataset", text_file, "--seqlen", "300", "--no-progress"]) == 2
    assert "longer than the model's context" in capsys.readouterr().err
    assert main(["eval", "ppl", "--model", str(tmp_path / "no-such-model"), "--no-progress"]) == 2
    assert main(["eval", "ppl", "--model", tiny_dir, "--dataset", str(tmp_path / "missing.txt"), "--seqlen", "32"]) == 2
