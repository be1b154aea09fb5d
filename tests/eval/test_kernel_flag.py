"""``lowbit eval --kernel``: the choices are the dispatcher's, and the flag reaches load_model."""

import argparse

import pytest

from lowbit.commands import eval as eval_cmd
from lowbit.kernels.dispatch import CHOICES


def _parse(*argv):
    p = argparse.ArgumentParser()
    eval_cmd.register(p.add_subparsers())
    return p.parse_args(["eval", *argv])


def test_choices_are_the_dispatchers():
    assert eval_cmd.KERNELS == CHOICES


@pytest.mark.parametrize("kind", ["ppl", "kl", "zeroshot"])
def test_every_kind_takes_the_flag(kind):
    extra = ["--ref", "default"] if kind == "kl" else []
    assert _parse(kind, *extra, "--kernel", "reference").kernel == "reference"
    assert _parse(kind, *extra).kernel is None  # LOWBIT_KERNEL or auto, decided by the dispatcher
    with pytest.raises(SystemExit):
        _parse(kind, *extra, "--kernel", "fastest")


def test_the_flag_reaches_load_model(monkeypatch):
    seen = {}

    def fake_load_model(name, dtype, device, kernel):
        seen.update(name=name, kernel=kernel)
        return object(), object()

    monkeypatch.setattr("lowbit.checkpoint.load_model", fake_load_model)
    eval_cmd._load("ckpt", None, "cpu", "reference")
    assert seen == {"name": "ckpt", "kernel": "reference"}
