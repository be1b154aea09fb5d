"""An export is published by renaming its temporary folder: every file in it (and the folder)
is flushed first, as a checkpoint save does, so a crash never leaves a published folder with
unwritten files; the parent folder is flushed after the rename."""

import os

from lowbit.export import export_compressed_tensors
from lowbit.quantize import get_scheme, quantize_model
from lowbit.quantize.overrides import apply_overrides
from tests.checkpoint.checkpoints import IDS
from tests.tiny_models import tiny_model


def test_the_export_is_flushed_before_it_is_renamed_into_place(tmp_path, monkeypatch):
    model = tiny_model("llama")
    quantize_model(model, apply_overrides(get_scheme("w4a16"), ["weights.group_size=32", "lm_head.bits=16"]), IDS,
                   progress=False)
    events = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"))),
                                                 real_fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda a, b: (events.append(("replace", os.fspath(a))), real_replace(a, b))[1])
    out = export_compressed_tensors(model, tmp_path / "ct")
    tmp = next(p for kind, p in events if kind == "replace")
    flushed = {p for kind, p in events[:events.index(("replace", tmp))] if kind == "fsync"}
    assert {tmp, f"{tmp}/model.safetensors", f"{tmp}/config.json"} <= flushed
    after = [p for kind, p in events[events.index(("replace", tmp)) + 1:] if kind == "fsync"]
    assert str(tmp_path) in after  # the parent, so that the rename itself is durable
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
