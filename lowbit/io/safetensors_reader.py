"""Read parts of a safetensors checkpoint (single file or sharded with an index) without loading
whole tensors: a tensor-parallel rank reads only the rows or columns of its shard, quantizing
from disk reads one decoder layer at a time."""

from __future__ import annotations

import json
from pathlib import Path

import torch


class CheckpointReader:
    """Lazy access to the tensors of a Hugging Face checkpoint folder, by name."""

    def __init__(self, folder: str | Path):
        from safetensors import safe_open

        folder = Path(folder)
        index = folder / "model.safetensors.index.json"
        if index.is_file():
            files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        else:
            files = [p.name for p in sorted(folder.glob("*.safetensors"))]
        if not files:
            raise FileNotFoundError(f"no safetensors checkpoint in {folder}")
        self._handles = [safe_open(str(folder / f), framework="pt") for f in files]
        self._where = {k: h for h in self._handles for k in h.keys()}

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def _slice(self, name: str):
        if name not in self._where:
            raise KeyError(f"tensor {name!r} is not in the checkpoint")
        return self._where[name].get_slice(name)

    def full(self, name: str) -> torch.Tensor:
        if name not in self._where:
            raise KeyError(f"tensor {name!r} is not in the checkpoint")
        return self._where[name].get_tensor(name)

    def rows(self, name: str, lo: int, hi: int) -> torch.Tensor:
        """Rows lo..hi-1 (dim 0) of a 1-D or 2-D tensor."""
        return self._slice(name)[lo:hi]

    def cols(self, name: str, lo: int, hi: int) -> torch.Tensor:
        """Columns lo..hi-1 (dim 1) of a 2-D tensor."""
        return self._slice(name)[:, lo:hi]

    def row_ranges(self, name: str, ranges: list[tuple[int, int]]) -> torch.Tensor:
        """Rows ``[lo, hi)`` of each range, concatenated in the given order (repeats allowed; e.g.
        a rank's heads, or the gate and up parts of a fused linear); reads only the span from the
        first to the last row needed."""
        lo, hi = min(r[0] for r in ranges), max(r[1] for r in ranges)
        part = self._slice(name)[lo:hi]
        if len(ranges) == 1:
            return part
        idx = torch.cat([torch.arange(a - lo, b - lo) for a, b in ranges])
        return part.index_select(0, idx)
