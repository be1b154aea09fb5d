"""The one JSON writer: numbers-like values become numbers, other odd values their string, a
failed write leaves the old file and no temporary behind."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from lowbit.bench.report import write_json as bench_write_json
from lowbit.io.atomic import write_json


def test_odd_values_and_one_writer(tmp_path):
    assert bench_write_json is write_json
    path = tmp_path / "r.json"
    write_json(path, {"a": np.float32(0.5), "b": torch.tensor(2.0), "p": Path("/x"), "d": torch.float32, "n": 3})
    text = path.read_text()
    assert text.endswith("}\n") and json.loads(text) == {"a": 0.5, "b": 2.0, "p": "/x", "d": "torch.float32", "n": 3}


def test_failed_write_keeps_the_old_file(tmp_path):
    path = tmp_path / "r.json"
    write_json(path, {"old": 1})
    with pytest.raises(ValueError):
        write_json(path, _circular())
    assert json.loads(path.read_text()) == {"old": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


def _circular():
    d = {}
    d["self"] = d
    return d
