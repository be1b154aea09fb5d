"""The two-shot quantized all-reduce (QuickReduce's design, see ``allreduce.py``) in rounds.

Phase 1: every rank encodes the round's W segments of whole 2048-value rows and an all-to-all
delivers segment r's encodings to rank r, which decodes, adds them in rank order and re-encodes
(:func:`reduce_round`). Phase 2: the reduced segments go to every rank, which decodes them all.
Rounds pipeline (:func:`run_rounds`): while one round's bytes travel, this rank encodes the next
and decodes the one before. Rows are independent, so rounds, their size and the depth never
change a bit.

Flat messages: :func:`two_shot`, :func:`pipelined`. Messages with a channel plan (outlier
channels, block Hadamard; ``channels.py``): :func:`two_shot_channels`, rounds of whole tokens that
run the plan's fused encode and decode-merge, without a float32 copy of the message in memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .codecs import ROW, Codec, fp_wire_dtype, n_rows
from .codecs.device import decode, encode, reduce_encode  # Triton on CUDA for INT8/INT4, else fast.py
from .collectives import all_gather_into, guarded, rank_order_sum, scratch
from .errors import AllReduceError

FP16_OVERFLOW_CLAMP = float(2**17)


def _start_exchange(send: torch.Tensor, seg_rows: int, world: int, rank: int, group, what: str,
                    recv: torch.Tensor):
    """Launch (async) an all-to-all of ``seg_rows``-row chunks with every *other* rank (chunks in
    rank order, own one left out); returns the work handle. The own chunk never travels: some
    backends (gloo) would push it through the link."""
    splits = [0 if r == rank else seg_rows for r in range(world)]
    return _launch(what, dist.all_to_all_single, recv, send, splits, splits, group=group)


def _launch(what: str, fn, *args, **kwargs):
    """Start one async collective; a peer that died or hung up becomes an AllReduceError."""
    try:
        return fn(*args, **kwargs, async_op=True)
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
    sum_dtype: torch.dtype | None = None  # the values the reduce adds (None: x's dtype)

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


def _reduce_own(r: Round, out: torch.Tensor) -> torch.Tensor:
    """Phase 1 done: the W contributions of our segment summed and re-encoded into ``out``."""
    r.wait()
    # fixed rank order (deterministic sums): rank 0's values, then += each next rank's; one fused
    # pass per row on CPU (decode, add, clamp, re-encode), the unfused steps elsewhere
    wires = [r.own if j == r.rank else _chunk(r.recv, j, r.rank, r.seg_rows) for j in range(r.world)]
    clamp = FP16_OVERFLOW_CLAMP if ((r.sum_dtype or r.x.dtype) == torch.float16 and r.codec.kind != "fp") else 0.0
    return reduce_encode(wires, r.codec, fp_wire=r.fpw, clamp=clamp, out=out)


def reduce_round(r: Round) -> Round:
    """Phase 1 done, phase 2 launched: sum the W contributions of our segment, re-encode it and
    start sending it to every peer (async)."""
    seg_rows, rank, rb = r.seg_rows, r.rank, r.codec.wire_row_bytes(r.fpw)
    r.mine = _reduce_own(r, r.buf("mine", (seg_rows, rb), torch.uint8))
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


def run_rounds(starts, stages, depth: int) -> None:
    """Rounds launched in order by ``starts`` (zero-argument callables), each then taken through
    ``stages``, with at most ``depth`` rounds in flight: whenever a round starts, every older one
    advances by one stage, oldest first (the same order on every rank, so the collectives match)."""
    if depth < 1:
        raise ValueError(f"pipeline depth must be >= 1, got {depth}")
    inflight: list[tuple[int, object]] = []  # (stages done, round), oldest first
    for start in starts:
        inflight.append((0, start()))
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


def pipelined(flat: torch.Tensor, step: int, codec: Codec, group=None, workspaces: list[dict] | None = None,
              depth: int = 3) -> None:
    """In-place two-shot all-reduce of ``flat`` in rounds of ``step`` elements, ``depth`` rounds in
    flight: while round i's bytes are on the wire (async collectives), this rank encodes round i+1
    and decodes round i-1. Rows are independent and every round runs the very same steps as
    :func:`two_shot`, so the result is bit-identical to the unpipelined algorithm on every rank.
    Each round's input is fully read (phase 1) before its output is written (the last step)."""
    n = flat.numel()

    def start(i: int, lo: int):
        part = flat[lo : lo + step]
        cached = workspaces is not None and (part.numel() == step or lo == 0)  # a short tail: no caching
        return lambda: start_round(part, codec, group, out=part, workspace=workspaces[i % depth] if cached else None)

    run_rounds([start(i, lo) for i, lo in enumerate(range(0, n, step))], (reduce_round, finish_round), depth)


class OutlierSums:
    """The outlier channels of a whole message, raw in its dtype: one all-gather launched up front
    (async, beside every round), summed in float32 in rank order when a round first needs them."""

    def __init__(self, x: torch.Tensor, plan, group, workspace: dict | None):
        self.world, self.nch, self.sums = dist.get_world_size(group), plan.channels.numel(), None
        if not self.nch:
            return
        ch = plan.channels.to(x.device)
        outl = torch.gather(x, 1, ch.expand(x.shape[0], -1))  # index_select(1, ...) took twice as long here
        self.all = scratch(workspace, "ch_outl_all", (self.world, outl.numel()), x.dtype, x.device)
        self.work = _launch("the outlier channels' all-gather", all_gather_into, self.all.view(-1), outl.reshape(-1),
                            group=group)

    def rows(self, t0: int, t1: int) -> torch.Tensor | None:
        """The float32 sums of tokens [t0, t1) (``[t1 - t0, N]``), or None without channels."""
        if not self.nch:
            return None
        if self.sums is None:
            guarded("the outlier channels' all-gather", self.work.wait)
            self.sums = rank_order_sum(self.all.view(self.world, -1, self.nch))
        return self.sums[t0:t1]


@dataclass
class ChannelRound(Round):
    """A two-shot round of whole tokens (from token t0) under a channel plan; the outlier channels
    travel once for the whole message (:class:`OutlierSums`)."""

    plan: object = None
    outliers: OutlierSums | None = None
    t0: int = 0
    gathered: torch.Tensor | None = None


def start_channel_round(x: torch.Tensor, codec: Codec, plan, group, out: torch.Tensor, workspace: dict | None,
                        outliers: OutlierSums, t0: int) -> ChannelRound:
    """Phase 1 launched for the tokens ``x`` ``[tokens, hidden]`` (the message's from ``t0``): the
    plan's fused encode (outlier channels zeroed, block Hadamard, codes) of every segment and the
    all-to-all. The rest is float32 as :meth:`ChannelPlan.split` gives it, so its sums are not
    clamped as float16 ones are."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    tokens, n, nch = x.shape[0], x.numel(), plan.channels.numel()
    rows = n_rows(n)
    r = ChannelRound(x, out, codec, group, world, rank, -(-rows // world), fp_wire_dtype(torch.float32), workspace,
                     sum_dtype=torch.float32, plan=plan, outliers=outliers, t0=t0)
    seg, rb = r.seg_rows, codec.wire_row_bytes(r.fpw)
    full = r.buf("ch_full", (world * seg, rb), torch.uint8)
    plan.encode(x, codec, full[:rows], r.buf("ch_outl", (tokens, nch), x.dtype))  # (the channels: OutlierSums)
    if world * seg > rows:  # the last segment's padding: zeros, as two_shot pads
        encode(torch.zeros((world * seg - rows) * ROW, device=x.device), codec, out=full[rows:])
    r.own = full[rank * seg : (rank + 1) * seg]
    if rank == 0 or rank == world - 1:  # the peers' segments are contiguous already
        send = full[seg:] if rank == 0 else full[: rank * seg]
    else:
        send = r.buf("ch_send", ((world - 1) * seg, rb), torch.uint8)
        send[: rank * seg].copy_(full[: rank * seg])
        send[rank * seg :].copy_(full[(rank + 1) * seg :])
    r.recv = r.buf("ch_recv", ((world - 1) * seg, rb), torch.uint8)
    r.what = "phase 1 (all-to-all)"
    r.work = _start_exchange(send, seg, world, rank, group, r.what, r.recv)
    return r


def reduce_channel_round(r: ChannelRound) -> ChannelRound:
    """Phase 1 done, phase 2 launched: our segment reduced and re-encoded, and one all-gather that
    lays every rank's segment out in rank order: the round's rows in message order, one wire."""
    rb = r.codec.wire_row_bytes(r.fpw)
    r.gathered = r.buf("ch_gathered", (r.world * r.seg_rows, rb), torch.uint8)
    r.mine = _reduce_own(r, r.buf("ch_mine", (r.seg_rows, rb), torch.uint8))
    r.what = "phase 2 (all-gather)"
    r.work = _launch(r.what, all_gather_into, r.gathered.view(-1), r.mine.view(-1), group=r.group)
    return r


def finish_channel_round(r: ChannelRound) -> torch.Tensor:
    """Phase 2 done: the round's rows decoded and merged (inverse Hadamard, the outlier sums in, one
    cast) into ``out`` in one pass."""
    r.wait()
    osum = r.outliers.rows(r.t0, r.t0 + r.x.shape[0])
    return r.plan.decode_merge([r.gathered[: n_rows(r.x.numel())]], r.codec, osum, r.out)


def two_shot_channels(x: torch.Tensor, codec: Codec, plan, group=None, out: torch.Tensor | None = None,
                      workspaces: list[dict] | None = None, step_values: int = 1 << 62, depth: int = 3) -> torch.Tensor:
    """The two-shot all-reduce of ``x`` ``[tokens, hidden]`` under a channel plan, into ``out`` (the
    same shape and dtype; may be x), in rounds of about ``step_values`` values, ``depth`` in flight.
    Rounds hold whole tokens and whole rows of the message (multiples of lcm(2048, hidden) values),
    so their rows are the message's rows: bit-identical to ``channel_accuracy.simulate_channels``
    (split, the flat two-shot of the float32 rest, merge) for every round size and depth."""
    if depth < 1:
        raise ValueError(f"pipeline depth must be >= 1, got {depth}")
    tokens, hidden = x.shape
    out = torch.empty_like(x) if out is None else out
    unit = math.lcm(ROW, hidden) // hidden  # tokens
    step = max(unit, step_values // hidden // unit * unit)
    outliers = OutlierSums(x, plan, group, workspaces[0] if workspaces else None)

    def start(i: int, t0: int):
        cached = bool(workspaces) and (t0 + step <= tokens or t0 == 0)  # a short tail: no caching
        return lambda: start_channel_round(x[t0 : t0 + step], codec, plan, group, out[t0 : t0 + step],
                                           workspaces[i % depth] if cached else None, outliers, t0)

    run_rounds([start(i, t0) for i, t0 in enumerate(range(0, tokens, step))],
               (reduce_channel_round, finish_channel_round), depth)
    return out
