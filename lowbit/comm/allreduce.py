"""QuickAllReduce: the two-shot quantized all-reduce (QuickReduce's design) on any torch.distributed backend.

Phase 1 (reduce-scatter): the flat tensor is cut into W segments of whole 2048-value rows; each
rank encodes all W segments and an all-to-all delivers to rank r every rank's encoding of
segment r. Rank r decodes the W contributions and adds them in fp32, in rank order.
Phase 2 (all-gather): rank r re-encodes its reduced segment and all ranks gather the bytes.
Every rank decodes the very same bytes, so every rank ends with a bit-identical result.

Non-finite input (NaN/Inf) poisons only its own 32-value block: the block decodes to NaN on every
rank, all other blocks are unaffected (the FP codec stays element-wise, like dist.all_reduce).
float16 sums that overflow become ±inf as in dist.all_reduce: before re-encoding, a float16 sum
is clamped to ±2^17, which every codec decodes beyond the float16 range.
"""

from __future__ import annotations

import os
import warnings

import torch
import torch.distributed as dist

from .codecs import CODECS, ROW, Codec, decode, decode_add, encode, fp_wire_dtype, get_codec, n_rows
from .errors import AllReduceError
from .metadata import DTYPE_CODES, check_same_job, signature
from .policy import ENV_CODEC, SizePolicy, load_table

FP16_OVERFLOW_CLAMP = float(2**17)
_CODEC_NAMES = list(CODECS)


def _collective(what: str, fn, *args, **kwargs) -> None:
    try:
        fn(*args, **kwargs)
    except RuntimeError as e:
        raise AllReduceError(
            f"quick all-reduce failed during {what}: a peer rank died, timed out or closed its connection ({e})"
        ) from e


def _buffer(ws: dict | None, name: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A scratch tensor, reused across calls when a workspace dict is given: fresh large
    allocations cost page faults on every call (QuickReduce keeps its buffers for the same reason)."""
    if ws is None:
        return torch.empty(shape, dtype=dtype, device=device)
    t = ws.get(name)
    if t is None or t.shape != shape or t.dtype != dtype or t.device != device:
        t = ws[name] = torch.empty(shape, dtype=dtype, device=device)
    return t


def _exchange(send: torch.Tensor, seg_rows: int, world: int, rank: int, group, what: str,
              recv: torch.Tensor) -> torch.Tensor:
    """All-to-all of ``seg_rows``-row chunks with every *other* rank (chunks in rank order, own one
    left out). The own chunk never travels: some backends (gloo) would push it through the link."""
    splits = [0 if r == rank else seg_rows for r in range(world)]
    _collective(what, dist.all_to_all_single, recv, send, splits, splits, group=group)
    return recv


def _chunk(recv: torch.Tensor, j: int, rank: int, seg_rows: int) -> torch.Tensor:
    """Peer j's chunk in a receive buffer that has no chunk for ``rank``."""
    k = j if j < rank else j - 1
    return recv[k * seg_rows : (k + 1) * seg_rows]


def two_shot(x: torch.Tensor, codec: Codec, group=None, out: torch.Tensor | None = None,
             workspace: dict | None = None) -> torch.Tensor:
    """The reduced values, flat, in x's dtype (written into the contiguous flat ``out`` if given,
    which may be x itself). Collective: call on every rank with the same size and dtype.
    ``workspace``: a dict that keeps the scratch buffers between calls."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    n, dtype, dev = x.numel(), x.dtype, x.device
    fpw = fp_wire_dtype(dtype)
    seg_rows = -(-n_rows(n) // world)
    seg_n = seg_rows * ROW
    flat = x.reshape(-1)
    if flat.numel() < seg_n * world:
        flat = torch.nn.functional.pad(flat, (0, seg_n * world - flat.numel()))
    rb = codec.row_bytes
    peers = (world - 1) * seg_rows
    # phase 1: encode the peers' segments straight into the send buffer, our own one aside
    send = _buffer(workspace, "send", (peers, rb), torch.uint8, dev)
    if rank:
        encode(flat[: rank * seg_n], codec, out=send[: rank * seg_rows])
    if rank < world - 1:
        encode(flat[(rank + 1) * seg_n :], codec, out=send[rank * seg_rows :])
    own = encode(flat[rank * seg_n : (rank + 1) * seg_n], codec, out=_buffer(workspace, "own", (seg_rows, rb), torch.uint8, dev))
    recv = _exchange(send, seg_rows, world, rank, group, "phase 1 (all-to-all)",
                     _buffer(workspace, "recv", (peers, rb), torch.uint8, dev))
    # fixed rank order (deterministic sums): rank 0's values, then += each next rank's
    acc = _buffer(workspace, "acc", (seg_n,), torch.float32, dev)
    decode(own if rank == 0 else _chunk(recv, 0, rank, seg_rows), codec, seg_n, torch.float32, fp_wire=fpw, out=acc)
    for j in range(1, world):
        decode_add(acc, own if j == rank else _chunk(recv, j, rank, seg_rows), codec, fp_wire=fpw)
    if dtype == torch.float16 and codec.kind != "fp":
        acc.clamp_(-FP16_OVERFLOW_CLAMP, FP16_OVERFLOW_CLAMP)
    # phase 2: every peer gets our reduced segment; decode each segment into place
    mine = encode(acc, codec, fp_wire=fpw, out=_buffer(workspace, "mine", (seg_rows, rb), torch.uint8, dev))
    gathered = _exchange(mine.repeat(world - 1, 1), seg_rows, world, rank, group, "phase 2 (all-gather)",
                         _buffer(workspace, "gathered", (peers, rb), torch.uint8, dev))
    if out is None:
        out = torch.empty(n, dtype=dtype, device=dev)
    for j in range(world):
        lo = j * seg_n
        if lo >= n:
            break
        hi = min(n, lo + seg_n)
        chunk = mine if j == rank else _chunk(gathered, j, rank, seg_rows)
        decode(chunk, codec, hi - lo, dtype, fp_wire=fpw, out=out[lo:hi])
    return out


class QuickAllReduce:
    """In-place SUM all-reduce that quantizes messages inside the size window, plain elsewhere.

    ``codec``: fp, int8, int6, int4, int3 or fp4 (env LOWBIT_QR_CODEC overrides). ``min_bytes`` /
    ``max_bytes`` override the tuned table (env LOWBIT_QR_MIN_BYTES / _MAX_BYTES override both).
    ``check_metadata``: exchange (numel, dtype, codec, path) first so that mismatched calls raise
    MetadataMismatchError on every rank instead of hanging or summing garbage.
    ``keep_buffers``: reuse the scratch buffers of the last message size (no page faults per call).
    ``chunk_bytes``: large messages run as several two-shot rounds of about this size (0: one
    round), which keeps scratch memory bounded and each collective's message moderate; the result
    is bit-identical either way (env LOWBIT_QR_CHUNK_BYTES).
    """

    def __init__(
        self,
        group=None,
        codec: str = "int4",
        *,
        min_bytes: int | None = None,
        max_bytes: int | None = None,
        check_metadata: bool = True,
        table: dict | None = None,
        keep_buffers: bool = True,
        chunk_bytes: int = 2 << 20,
    ):
        if not dist.is_initialized():
            raise RuntimeError("QuickAllReduce needs an initialised torch.distributed process group")
        self.group = group
        self.codec: Codec = get_codec(os.environ.get(ENV_CODEC) or codec)
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.check_metadata = check_metadata
        self.chunk_bytes = int(os.environ.get("LOWBIT_QR_CHUNK_BYTES", chunk_bytes))
        self.policy = SizePolicy(
            self.codec.name, self.world_size, min_bytes, max_bytes, load_table() if table is None else table
        )
        if self.codec.name == "int3" and self.world_size > 2:
            warnings.warn(
                f"INT3 at world size {self.world_size}: every rank's input and the sum are each quantized to "
                "3 bits, so the error grows with the world size while the gain over INT4 is small; prefer int4",
                stacklevel=2,
            )
        self.last_path = ""
        self._workspace: dict = {}  # scratch buffers kept between calls (keep_buffers=False: none)
        if not keep_buffers:
            self._workspace = None  # type: ignore[assignment]

    def will_quantize(self, t: torch.Tensor) -> bool:
        if t.dtype not in DTYPE_CODES or self.world_size < 2 or t.numel() == 0:
            return False
        return self.policy.use_quick(t.numel() * t.element_size(), t.dtype)

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum ``tensor`` over the group in place (like ``dist.all_reduce``) and return it."""
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"all_reduce takes a torch.Tensor, got {type(tensor).__name__}")
        quick = self.will_quantize(tensor)
        if self.check_metadata:
            sig = signature(tensor, _CODEC_NAMES.index(self.codec.name), quick)
            check_same_job(sig, tensor.device, self.group, _CODEC_NAMES)
        if not quick:
            self.last_path = "plain"
            _collective("plain all_reduce", dist.all_reduce, tensor, group=self.group)
            return tensor
        self.last_path = self.codec.name
        flat = tensor.view(-1) if tensor.is_contiguous() else tensor.reshape(-1)
        step = self._chunk_elems(tensor.element_size())
        for lo in range(0, flat.numel(), step):  # rows are independent: chunking never changes a bit
            part = flat[lo : lo + step]
            # each chunk is fully read (phase 1) before it is overwritten (phase 2)
            ws = self._workspace if (part.numel() == step or lo == 0) else None  # a short tail: no caching
            two_shot(part, self.codec, self.group, out=part, workspace=ws)
        if not tensor.is_contiguous():
            tensor.copy_(flat.view(tensor.shape))
        return tensor

    def _chunk_elems(self, elem_size: int) -> int:
        """Elements per two-shot round: a whole number of rows per rank, about chunk_bytes."""
        unit = ROW * self.world_size
        if self.chunk_bytes <= 0:
            return 1 << 62
        return max(unit, self.chunk_bytes // elem_size // unit * unit)
