"""Saving over a checkpoint: nothing the user put there is deleted, the old checkpoint stays whole
until the new one is, and what a killed save leaves is recognised."""

import os
import shutil

import pytest
import torch

from lowbit.checkpoint import load_quantized, save_quantized
from lowbit.io import swap
from lowbit.io.outputs import OutputPathError
from tests.tiny_models import tiny_model
from lowbit.quantize import get_scheme, quantize_model

IDS = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))
DEAD_PID = 2**31 - 2  # above any pid_max: no such process


def _quantized(scheme):
    model = tiny_model("llama")
    quantize_model(model, get_scheme(scheme), IDS, progress=False)
    return model


@pytest.fixture(scope="module")
def models():
    return _quantized("w8a8"), _quantized("w4a4-rtn")


def _logits(model):
    with torch.no_grad():
        return model(IDS).logits


def _leftovers(parent):
    return sorted(p.name for p in parent.iterdir() if swap.is_temp_name(p.name))


def test_users_files_are_never_deleted(models, tmp_path):
    old, new = models
    out = save_quantized(old, tmp_path / "q")
    (out / "NOTES.md").write_text("my notes")
    (out / "eval_results").mkdir()
    (out / "eval_results" / "ppl.json").write_text("{}")
    with pytest.raises(OutputPathError, match="NOTES.md, eval_results"):
        save_quantized(new, out)
    assert (out / "NOTES.md").read_text() == "my notes" and (out / "eval_results" / "ppl.json").is_file()
    assert load_quantized(out)[0].lowbit_scheme.name == "w8a8"


def test_overwrite_swaps_whole_folders_even_if_rename_fails(models, tmp_path, monkeypatch):
    """The swap needs no rename of the target itself, so a failing rename cannot leave it missing."""
    old, new = models
    out = save_quantized(old, tmp_path / "q")
    real_replace, real_rename = os.replace, os.rename

    def refuse_target(src, dst, **kw):
        if os.path.abspath(dst) == str(out) or os.path.abspath(src) == str(out):
            raise OSError("simulated interruption")
        return real_replace(src, dst, **kw)

    monkeypatch.setattr(os, "replace", refuse_target)
    monkeypatch.setattr(os, "rename", refuse_target)
    try:
        save_quantized(new, out)
    except OSError:
        pass
    monkeypatch.setattr(os, "replace", real_replace)
    monkeypatch.setattr(os, "rename", real_rename)
    again, _ = load_quantized(out)
    assert torch.equal(_logits(again), _logits(new))
    assert _leftovers(tmp_path) == []


def test_without_exchange_a_failed_second_rename_puts_the_old_one_back(models, tmp_path, monkeypatch):
    old, new = models
    out = save_quantized(old, tmp_path / "q")
    monkeypatch.setattr(swap, "_exchange", lambda a, b: False)
    real = os.rename

    def fail_into_target(src, dst):
        if os.path.abspath(dst) == str(out) and swap.is_temp_name(os.path.basename(src)) and ".tmp-" in str(src):
            raise OSError("simulated failure")
        return real(src, dst)

    monkeypatch.setattr(os, "rename", fail_into_target)
    with pytest.raises(OSError, match="simulated"):
        save_quantized(new, out)
    assert torch.equal(_logits(load_quantized(out)[0]), _logits(old))
    assert _leftovers(tmp_path) == []


def test_what_killed_saves_left_is_recovered_or_removed(models, tmp_path):
    old, new = models
    out = save_quantized(old, tmp_path / "q")
    os.rename(out, tmp_path / f".old-lowbit-{DEAD_PID}-q")  # killed between the two renames
    shutil.copytree(tmp_path / f".old-lowbit-{DEAD_PID}-q", tmp_path / f".tmp-lowbit-{DEAD_PID}-x")
    live = tmp_path / f".tmp-lowbit-{os.getppid()}-y"  # another save still running
    live.mkdir()
    save_quantized(new, tmp_path / "other")
    assert torch.equal(_logits(load_quantized(out)[0]), _logits(old))
    assert _leftovers(tmp_path) == [live.name]


def test_working_directory_is_refused_before_anything_is_written(models, tmp_path, monkeypatch):
    old, new = models
    out = save_quantized(old, tmp_path / "q")
    monkeypatch.chdir(out)
    with pytest.raises(OutputPathError, match="working directory"):
        save_quantized(new, ".")
    assert _leftovers(tmp_path) == [] and load_quantized(out)[0].lowbit_scheme.name == "w8a8"


def test_the_parent_folder_is_flushed_after_the_swap(models, tmp_path, monkeypatch):
    """A rename is durable only once its folder is flushed: the save fsyncs the target's parent
    after publishing, for a new target and for an overwrite alike."""
    old, new = models
    flushed = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (flushed.append(os.readlink(f"/proc/self/fd/{fd}")), real(fd))[1])
    for model in (old, new):
        flushed.clear()
        out = save_quantized(model, tmp_path / "q")
        assert flushed[-1] == str(tmp_path) and load_quantized(out)[0] is not None
