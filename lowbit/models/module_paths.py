"""Submodules by dotted path (``self_attn.q_proj``, ``model.layers.3.mlp``): the one way lowbit
reads a submodule and replaces one (a packed linear, a permuted norm, a sharded linear), so a
path means the same thing to the quantizer, the checkpoint layout and the sharder."""

from __future__ import annotations

from torch import nn


def get_path(root: nn.Module, path: str):
    """The submodule (or parameter) at ``path``; a digit part indexes a ModuleList.
    AttributeError/IndexError when the path does not exist."""
    obj = root
    for part in path.split("."):
        obj = getattr(obj, part) if not part.isdigit() else obj[int(part)]
    return obj


def set_path(root: nn.Module, path: str, value) -> None:
    """Put ``value`` at ``path`` (replacing what is there), registered like any submodule."""
    parent, _, name = path.rpartition(".")
    obj = get_path(root, parent) if parent else root
    if name.isdigit():
        obj[int(name)] = value
    else:
        setattr(obj, name, value)
