"""Calibration text: the default source, user files, and refusal of evaluation text."""

import pytest
import torch

from lowbit.data import DataNotFoundError, calibration_ids, calibration_text, data_file


class CharTokenizer:
    """A stand-in tokenizer: one id per character, enough to test windowing."""

    def __call__(self, text, return_tensors=None):
        class Out:
            input_ids = torch.tensor([[ord(c) % 1000 for c in text]])

        return Out()


def test_default_is_wikitext2_validation():
    text = calibration_text()
    assert text.startswith(data_file("wikitext2/wiki.valid.tokens").read_text()[:100])


def test_evaluation_text_is_refused():
    with pytest.raises(ValueError, match="evaluation text"):
        calibration_text(str(data_file("wikitext2/wiki.test.raw")))


def test_user_file_and_missing_file(tmp_path):
    f = tmp_path / "calib.txt"
    f.write_text("hello world " * 100)
    assert calibration_text(str(f)).startswith("hello")
    with pytest.raises(FileNotFoundError):
        calibration_text(str(tmp_path / "nope.txt"))


def test_windows_are_seeded_and_shaped(tmp_path):
    f = tmp_path / "calib.txt"
    f.write_text("".join(chr(65 + i % 26) for i in range(5000)))
    a = calibration_ids(CharTokenizer(), 3, 50, source=str(f), seed=1)
    b = calibration_ids(CharTokenizer(), 3, 50, source=str(f), seed=1)
    assert a.shape == (3, 50) and torch.equal(a, b)


def test_too_short_and_bad_sizes(tmp_path):
    f = tmp_path / "short.txt"
    f.write_text("tiny")
    with pytest.raises(ValueError, match="fewer than one window"):
        calibration_ids(CharTokenizer(), 1, 50, source=str(f))
    with pytest.raises(ValueError, match="positive"):
        calibration_ids(CharTokenizer(), 0, 50, source=str(f))


def test_missing_data_root_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("LOWBIT_DATA", str(tmp_path))
    with pytest.raises(DataNotFoundError, match="LOWBIT_DATA"):
        calibration_text()
