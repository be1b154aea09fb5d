"""QuickAllReduce: the two-shot quantized all-reduce (QuickReduce's design) on any torch.distributed backend.

Small quantized messages take the one-shot path instead (``oneshot.py``: one all-gather) and
messages outside the quantize window plain ``dist.all_reduce``; ``policy.py`` decides per message.

Phase 1 (reduce-scatter): the flat tensor is cut into W segments of whole 2048-value rows; each
rank encodes all W segments and an all-to-all delivers to rank r every rank's encoding of
segment r. Rank r decodes the W contributions and adds them in fp32, in rank order.
Phase 2 (all-gather): rank r re-encodes its reduced segment and all ranks gather the bytes.
Every rank decodes the very same bytes, so every rank ends with a bit-identical result.

The FP codec sends the raw values in the input dtype (float32 stays float32), so its result
differs from ``dist.all_reduce`` only by the order of the fp32 additions.

Range: finite input never turns into NaN/Inf. A block whose FP16 scale would overflow (e.g. INT4
beyond 524032, FP4 beyond 393120) travels with an extended scale (``codecs/extscale.py``: two
significant bits, any float32 exponent; error at most two scale steps), so the quantized path
still runs and every rank decodes the same bytes. Decoded values stay within bfloat16's range.
Non-finite input (NaN/Inf) poisons only its own 32-value block: the block decodes to NaN on every
rank, all other blocks are unaffected (the FP codec stays element-wise, like dist.all_reduce);
so does a float32/bfloat16 sum that overflows float32 (the wire cannot carry inf).
float16 sums that overflow (|sum| ≥ 65520) become ±inf as in dist.all_reduce: before re-encoding,
each rank's float16 contribution is saturated to ±65504 (FP4 may decode 65504 as 65520) and an
overflowing sum set to ±2^17, which every codec decodes beyond the float16 range; a sum in
(65504, 65520) becomes 65504, as float16 rounds it.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .channels import ChannelPlan
from .codecs import CODECS, ROW, Codec, fp_wire_dtype, n_rows, parse_spec
from .codecs.device import decode, encode, reduce_encode  # Triton on CUDA for INT8/INT4, else fast.py
from .collectives import all_gather_into, guarded, scratch
from .errors import AllReduceError
from .metadata import DTYPE_CODES, PATHS, CheckedJobs, options_code
from .oneshot import one_shot, one_shot_channels
from .policy import ENV_CODEC, SizePolicy, load_table

FP16_OVERFLOW_CLAMP = float(2**17)
_CODEC_NAMES = list(CODECS)


def _start_exchange(send: torch.Tensor, seg_rows: int, world: int, rank: int, group, what: str,
                    recv: torch.Tensor):
    """Launch (async) an all-to-all of ``seg_rows``-row chunks with every *other* rank (chunks in
    rank order, own one left out); returns the work handle. The own chunk never travels: some
    backends (gloo) would push it through the link."""
    splits = [0 if r == rank else seg_rows for r in range(world)]
    try:
        return dist.all_to_all_single(recv, send, splits, splits, group=group, async_op=True)
    except RuntimeError as e:
        raise AllReduceError(
            f"quick all-reduce failed during {what}: a peer rank died, timed out or closed its connection ({e})"
        ) from e


def _chunk(recv: torch.Tensor, j: int, rank: int, seg_rows: int) -> torch.Tensor:
    """Peer j's chunk in a receive buffer that has no chunk for ``rank``."""
    k = j if j < rank else j - 1
    return recv[k * seg_rows : (k + 1) * seg_rows]


@dataclass
class Round:
    """One two-shot round in flight: its buffers and the pending collective (see :func:`two_shot`)."""

    x: torch.Tensor
    out: torch.Tensor | None
    codec: Codec
    group: object
    world: int
    rank: int
    seg_rows: int
    fpw: torch.dtype
    ws: dict | None
    work: object = None
    what: str = ""
    recv: torch.Tensor | None = None
    own: torch.Tensor | None = None
    mine: torch.Tensor | None = None

    @property
    def seg_n(self) -> int:
        return self.seg_rows * ROW

    def buf(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        return scratch(self.ws, name, shape, dtype, self.x.device)

    def wait(self) -> None:
        guarded(self.what, self.work.wait)
        self.work = None


def start_round(x: torch.Tensor, codec: Codec, group=None, out: torch.Tensor | None = None,
                workspace: dict | None = None) -> Round:
    """Phase 1, launched: encode the peers' segments and start the all-to-all (async)."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    n, dtype = x.numel(), x.dtype
    seg_rows = -(-n_rows(n) // world)
    r = Round(x, out, codec, group, world, rank, seg_rows, fp_wire_dtype(dtype), workspace)
    seg_n = r.seg_n
    flat = x.reshape(-1)
    if flat.numel() < seg_n * world:
        flat = torch.nn.functional.pad(flat, (0, seg_n * world - flat.numel()))
    rb = codec.wire_row_bytes(r.fpw)  # FP codec: 2 or 4 bytes per value (raw input dtype)
    peers = (world - 1) * seg_rows
    # encode the peers' segments straight into the send buffer, our own one aside
    send = r.buf("send", (peers, rb), torch.uint8)
    if rank:
        encode(flat[: rank * seg_n], codec, out=send[: rank * seg_rows])
    if rank < world - 1:
        encode(flat[(rank + 1) * seg_n :], codec, out=send[rank * seg_rows :])
    r.own = encode(flat[rank * seg_n : (rank + 1) * seg_n], codec, out=r.buf("own", (seg_rows, rb), torch.uint8))
    r.recv = r.buf("recv", (peers, rb), torch.uint8)
    r.what = "phase 1 (all-to-all)"
    r.work = _start_exchange(send, seg_rows, world, rank, group, r.what, r.recv)
    return r


def reduce_round(r: Round) -> Round:
    """Phase 1 done, phase 2 launched: sum the W contributions of our segment, re-encode it and
    start sending it to every peer (async)."""
    r.wait()
    seg_rows, rank, codec, fpw = r.seg_rows, r.rank, r.codec, r.fpw
    # fixed rank order (deterministic sums): rank 0's values, then += each next rank's; one fused
    # pass per row on CPU (decode, add, clamp, re-encode), the unfused steps elsewhere
    wires = [r.own if j == rank else _chunk(r.recv, j, rank, seg_rows) for j in range(r.world)]
    clamp = FP16_OVERFLOW_CLAMP if (r.x.dtype == torch.float16 and codec.kind != "fp") else 0.0
    rb = codec.wire_row_bytes(fpw)
    r.mine = reduce_encode(wires, codec, fp_wire=fpw, clamp=clamp, out=r.buf("mine", (seg_rows, rb), torch.uint8))
    send = r.buf("mine_x", ((r.world - 1) * seg_rows, rb), torch.uint8)
    send.view(r.world - 1, seg_rows, rb).copy_(r.mine.unsqueeze(0).expand(r.world - 1, seg_rows, rb))
    r.recv = r.buf("gathered", ((r.world - 1) * seg_rows, rb), torch.uint8)
    r.what = "phase 2 (all-gather)"
    r.work = _start_exchange(send, seg_rows, r.world, rank, r.group, r.what, r.recv)
    return r


def finish_round(r: Round) -> torch.Tensor:
    """Phase 2 done: decode every segment into place; the reduced values, flat, in x's dtype."""
    r.wait()
    n, dtype = r.x.numel(), r.x.dtype
    out = r.out if r.out is not None else torch.empty(n, dtype=dtype, device=r.x.device)
    for j in range(r.world):
        lo = j * r.seg_n
        if lo >= n:
            break
        hi = min(n, lo + r.seg_n)
        chunk = r.mine if j == r.rank else _chunk(r.recv, j, r.rank, r.seg_rows)
        decode(chunk, r.codec, hi - lo, dtype, fp_wire=r.fpw, out=out[lo:hi])
    return out


def two_shot(x: torch.Tensor, codec: Codec, group=None, out: torch.Tensor | None = None,
             workspace: dict | None = None) -> torch.Tensor:
    """The reduced values, flat, in x's dtype (written into the contiguous flat ``out`` if given,
    which may be x itself). Collective: call on every rank with the same size and dtype.
    ``workspace``: a dict that keeps the scratch buffers between calls."""
    return finish_round(reduce_round(start_round(x, codec, group, out, workspace)))


def pipelined(flat: torch.Tensor, step: int, codec: Codec, group=None, workspaces: list[dict] | None = None,
              depth: int = 3) -> None:
    """In-place two-shot all-reduce of ``flat`` in rounds of ``step`` elements, ``depth`` rounds in
    flight: while round i's bytes are on the wire (async collectives), this rank encodes round i+1
    and decodes round i-1. Rows are independent and every round runs the very same steps as
    :func:`two_shot`, so the result is bit-identical to the unpipelined algorithm on every rank.
    Each round's input is fully read (phase 1) before its output is written (the last step)."""
    if depth < 1:
        raise ValueError(f"pipeline depth must be >= 1, got {depth}")
    stages = (reduce_round, finish_round)
    inflight: list[tuple[int, Round]] = []  # (stages done, round), oldest first
    n = flat.numel()
    for i, lo in enumerate(range(0, n, step)):
        part = flat[lo : lo + step]
        ws = None
        if workspaces is not None and (part.numel() == step or lo == 0):  # a short tail: no caching
            ws = workspaces[i % depth]
        inflight.append((0, start_round(part, codec, group, out=part, workspace=ws)))
        # advance every older round by one stage, oldest first (the same order on every rank)
        nxt = []
        for done, r in inflight[:-1]:
            stages[done](r)
            if done + 1 < len(stages):
                nxt.append((done + 1, r))
        inflight = nxt + inflight[-1:]
        while len(inflight) >= depth:  # bound the rounds (and buffers) in flight
            done, r = inflight.pop(0)
            for st in stages[done:]:
                st(r)
    for done, r in inflight:  # drain, oldest first
        for st in stages[done:]:
            st(r)


class QuickAllReduce:
    """In-place SUM all-reduce that quantizes messages inside the size window, plain elsewhere.

    ``codec``: fp, int8, int6, int4, int3 or fp4 (env LOWBIT_QR_CODEC overrides), with the options
    ``+h`` (block Hadamard) and ``+oN`` (N exact outlier channels) for messages whose last dimension
    is ``hidden`` (``channels.py``): ``outliers`` are the N channels (the same on every rank; a
    per-call plan from :meth:`plan_for` overrides them, e.g. one set per layer). ``min_bytes`` /
    ``max_bytes`` override the tuned table (env LOWBIT_QR_MIN_BYTES / _MAX_BYTES override both).
    Quantized messages below ``twoshot_min_bytes`` take the one-shot path (one all-gather,
    ``oneshot.py``), the others two-shot (env LOWBIT_QR_TWOSHOT_MIN_BYTES; see ``policy.py``).
    ``check_metadata``: exchange (numel, dtype, codec, path) the first time a job (shape, dtype)
    is seen, so that mismatched calls raise MetadataMismatchError on every rank instead of hanging
    or summing garbage; later calls of a checked job skip it (``metadata.CheckedJobs``), so a rank
    that changes its message size between calls meets peers that skip the check: gloo then aborts
    that collective (an AllReduceError or a crashed rank, not MetadataMismatchError);
    ``check_metadata="always"`` checks every call (one more collective each) for such callers.
    ``keep_buffers``: reuse the scratch buffers of the last message size (no page faults per call).
    ``chunk_bytes``: large messages run as several two-shot rounds of about this size (0: one
    round), which keeps scratch memory bounded and each collective's message moderate; the result
    is bit-identical either way (env LOWBIT_QR_CHUNK_BYTES).
    ``pipeline_depth``: rounds in flight at once (1: one after another; 3, the default: round i's
    transfer overlaps the encoding of round i+1 and the decoding of round i-1), bit-identical for
    every depth (env LOWBIT_QR_PIPELINE_DEPTH).
    """

    def __init__(
        self,
        group=None,
        codec: str = "int4",
        *,
        min_bytes: int | None = None,
        max_bytes: int | None = None,
        check_metadata: bool | str = True,
        table: dict | None = None,
        keep_buffers: bool = True,
        chunk_bytes: int = 2 << 20,
        pipeline_depth: int = 3,
        twoshot_min_bytes: int | None = None,
        hidden: int | None = None,
        outliers=None,
    ):
        if not dist.is_initialized():
            raise RuntimeError("QuickAllReduce needs an initialised torch.distributed process group")
        self.group = group
        self.spec = parse_spec(os.environ.get(ENV_CODEC) or codec)
        self.codec: Codec = self.spec.codec
        self.hidden = hidden
        self.plan: ChannelPlan | None = ChannelPlan.make(self.spec, hidden, outliers) if (
            self.spec.plain_codec or not self.spec.outliers or outliers is not None) else None
        self._options = options_code(self.spec.hadamard, self.spec.outliers)
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        if check_metadata not in (True, False, "always"):
            raise ValueError(f"check_metadata must be True, False or 'always', got {check_metadata!r}")
        self.check_metadata = check_metadata
        self.chunk_bytes = int(os.environ.get("LOWBIT_QR_CHUNK_BYTES", chunk_bytes))
        self.pipeline_depth = int(os.environ.get("LOWBIT_QR_PIPELINE_DEPTH", pipeline_depth))
        if self.pipeline_depth < 1:
            raise ValueError(f"pipeline_depth must be >= 1, got {self.pipeline_depth}")
        self.policy = SizePolicy(
            self.codec.name, self.world_size, min_bytes, max_bytes, load_table() if table is None else table,
            twoshot_min_bytes,
        )
        self.checked = CheckedJobs(group, _CODEC_NAMES)
        if self.codec.name == "int3" and self.world_size > 2:
            warnings.warn(
                f"INT3 at world size {self.world_size}: every rank's input and the sum are each quantized to "
                "3 bits, so the error grows with the world size while the gain over INT4 is small; prefer int4",
                stacklevel=2,
            )
        self.last_path = ""  # "plain" or the codec's name
        self.last_shot = ""  # the last quantized call's path: "oneshot" or "twoshot"
        # scratch buffers kept between calls, one set per round in flight (keep_buffers=False: none)
        self._workspaces: list[dict] | None = [{} for _ in range(self.pipeline_depth)] if keep_buffers else None

    def path(self, t: torch.Tensor) -> str:
        """"plain", "oneshot" or "twoshot": the path ``all_reduce(t)`` takes."""
        if t.dtype not in DTYPE_CODES or self.world_size < 2 or t.numel() == 0:
            return "plain"
        return self.policy.path(t.numel() * t.element_size(), t.dtype)

    def will_quantize(self, t: torch.Tensor) -> bool:
        return self.path(t) != "plain"

    def plan_for(self, outliers) -> ChannelPlan | None:
        """The channel plan of this all-reduce's codec with these outlier channels (validated once;
        pass it to :meth:`all_reduce` per call, e.g. one per layer)."""
        return ChannelPlan.make(self.spec, self.hidden, outliers)

    def all_reduce(self, tensor: torch.Tensor, plan: ChannelPlan | None = None) -> torch.Tensor:
        """Sum ``tensor`` over the group in place (like ``dist.all_reduce``) and return it.
        ``plan``: this call's outlier channels (:meth:`plan_for`), else the constructor's."""
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"all_reduce takes a torch.Tensor, got {type(tensor).__name__}")
        plan = plan or self.plan
        if plan is None and not self.spec.plain_codec:
            raise ValueError(f"codec {self.spec.name!r} needs its outlier channels: QuickAllReduce(outliers=...) "
                             "or all_reduce(t, plan=qar.plan_for(channels))")
        path = self.path(tensor)
        if plan is not None and path != "plain":
            plan.check(tensor)
        if self.check_metadata:
            quantized = plan is not None and path != "plain"
            self.checked.check(tensor, _CODEC_NAMES.index(self.codec.name), PATHS.index(path),
                               cached=self.check_metadata != "always", options=self._options if quantized else 0,
                               channels=plan.digest if quantized else 0)
        if path == "plain":
            self.last_path = "plain"
            guarded("plain all_reduce", dist.all_reduce, tensor, group=self.group)
            return tensor
        self.last_path = self.spec.name
        self.last_shot = path
        if plan is not None:
            return self._reduce_channels(tensor, plan, path)
        flat = tensor.view(-1) if tensor.is_contiguous() else tensor.reshape(-1)
        self._reduce_flat(flat, path)
        if not tensor.is_contiguous():
            tensor.copy_(flat.view(tensor.shape))
        return tensor

    def _reduce_channels(self, tensor: torch.Tensor, plan: ChannelPlan, path: str) -> torch.Tensor:
        """The outlier channels travel raw (one async all-gather, summed in float32 in rank order)
        while the rest, zeroed there and block-transformed, takes the codec's path; then merged."""
        ws = self._workspaces[0] if self._workspaces else None
        if path == "oneshot":  # one collective: the outlier channels ride with the encoded rest
            flat = tensor.view(-1) if tensor.is_contiguous() else tensor.reshape(-1)
            one_shot_channels(flat.view(-1, plan.hidden), self.codec, plan, self.group, out=flat, workspace=ws)
            if not tensor.is_contiguous():
                tensor.copy_(flat.view(tensor.shape))
            return tensor
        rest, outl = plan.split(tensor, ws)
        work = gathered = None
        if outl.numel():
            gathered = scratch(ws, "outl_all", (self.world_size, outl.numel()), outl.dtype, outl.device)
            try:
                work = all_gather_into(gathered.view(-1), outl.reshape(-1), group=self.group, async_op=True)
            except RuntimeError as e:
                raise AllReduceError(f"quick all-reduce failed during the outlier channels' all-gather: {e}") from e
        self._reduce_flat(rest.view(-1), path)
        osum = None
        if work is not None:
            guarded("the outlier channels' all-gather", work.wait)
            osum = gathered[0].float()
            for j in range(1, self.world_size):  # rank order, as every rank adds them
                osum += gathered[j].float()
            osum = osum.view(-1, outl.shape[-1])
        return plan.merge(rest, osum, tensor)

    def _reduce_flat(self, flat: torch.Tensor, path: str) -> None:
        """The codec's one-shot or two-shot all-reduce of a flat contiguous tensor, in place."""
        if path == "oneshot":
            one_shot(flat, self.codec, self.group, out=flat, workspace=self._workspaces[0] if self._workspaces else None)
        else:
            step = self._chunk_elems(flat.element_size())
            # rows are independent: neither chunking nor pipelining changes a bit
            pipelined(flat, step, self.codec, self.group, self._workspaces, self.pipeline_depth)

    def _chunk_elems(self, elem_size: int) -> int:
        """Elements per two-shot round: a whole number of rows per rank, about chunk_bytes."""
        unit = ROW * self.world_size
        if self.chunk_bytes <= 0:
            return 1 << 62
        return max(unit, self.chunk_bytes // elem_size // unit * unit)
