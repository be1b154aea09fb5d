"""The formats study: its grid, its accounting, and a run on a tiny model."""

import json

import torch

from lowbit.eval.format_study import format_grid, plot_study, run_study
from lowbit.formats import IntFormat, PerChannel, PerToken
from tests.tiny_models import tiny_llama


class Tok:
    def __call__(self, text, return_tensors=None):
        class Out:
            input_ids = torch.tensor([[hash(w) % 120 + 2 for w in text.split()]])

        return Out()


def test_grid_covers_the_issue_formats():
    labels = [label for _, label, _ in format_grid()]
    for bits in (8, 6, 4, 3, 2):
        for sym in ("sym", "asym"):
            for g in ("channel", "g128", "g32"):
                assert f"INT{bits} {sym} {g}" in labels
    assert sum(fam == "fp4" for fam, _, _ in format_grid()) == 3
    assert sum(fam == "fp8" for fam, _, _ in format_grid()) == 2
    # "channel" means output row for weights and token for activations
    make = dict((label, m) for _, label, m in format_grid())["INT4 sym channel"]
    assert make("weight") == IntFormat(4, True, PerChannel(0))
    assert make("activation") == IntFormat(4, True, PerToken())


def test_study_on_tiny_model(tmp_path):
    model = tiny_llama(vocab_size=128, layers=2)
    res = run_study(model, Tok(), samples=2, seqlen=32, keep_rows=16, progress=False)
    rows = {r["label"]: r for r in res["formats"]}
    assert res["n_weight_tensors"] == 14 and res["n_input_sites"] == 8
    # more bits, less error; asymmetric g32 costs 4 + 32/32 bits
    assert rows["INT8 sym g32"]["weight_sqnr_db"] > rows["INT4 sym g32"]["weight_sqnr_db"] > rows["INT2 sym g32"]["weight_sqnr_db"]
    assert abs(rows["INT4 asym g32"]["weight_bits"] - 5.0) < 1e-9
    assert abs(rows["INT4 sym g32"]["act_bits"] - 4.5) < 1e-9
    assert res["outliers"][0]["ratio"] >= res["outliers"][-1]["ratio"]
    json.dumps(res)
    png = tmp_path / "f.png"
    plot_study(res, str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
