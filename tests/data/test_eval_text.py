import pytest

from lowbit.data.eval_text import eval_text, eval_token_ids


def test_wikitext2_is_the_raw_test_split():
    text = eval_text("wikitext2")
    assert text.startswith("\n\n = Robert Boulter = \n")  # row 0 of the split is empty
    assert len(text) > 1_000_000


def test_ptb_lines_are_stripped_and_joined_with_blank_lines():
    text = eval_text("ptb")
    parts = text.split("\n\n")
    assert len(parts) == 3762
    assert parts[0] == "no it was n't black monday"
    assert all(p == p.strip() for p in parts[:50])


def test_text_file_and_errors(tmp_path):
    f = tmp_path / "t.txt"
    f.write_text("hello world")
    assert eval_text(str(f)) == "hello world"
    with pytest.raises(FileNotFoundError, match="unknown evaluation dataset"):
        eval_text("c4")
    (tmp_path / "empty.txt").write_text("  \n")
    with pytest.raises(ValueError, match="empty"):
        eval_text(str(tmp_path / "empty.txt"))


def test_missing_shared_data_is_a_clear_error(monkeypatch, tmp_path):
    from lowbit.data import DataNotFoundError

    monkeypatch.setenv("LOWBIT_DATA", str(tmp_path))
    with pytest.raises(DataNotFoundError, match="LOWBIT_DATA"):
        eval_text("wikitext2")


def test_token_ids_are_cached(tmp_path):
    from lowbit.models import ModelNotFoundError, load_tokenizer

    try:
        tok = load_tokenizer("default")
    except ModelNotFoundError as e:
        pytest.skip(str(e))
    f = tmp_path / "t.txt"
    f.write_text("one two three four five six seven")
    a = eval_token_ids(tok, str(f))
    assert a is eval_token_ids(tok, str(f))
    assert a.tolist() == tok("one two three four five six seven").input_ids
