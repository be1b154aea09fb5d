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

import torch
import torch.distributed as dist

from .channels import ChannelPlan
from .codecs import CODECS, ROW, Codec, parse_spec
from .collectives import guarded
from .metadata import DTYPE_CODES, PATHS, CheckedJobs, options_code
from .oneshot import one_shot, one_shot_channels
from .policy import ENV_CODEC, SizePolicy, load_table
from .twoshot import pipelined, two_shot_channels

_CODEC_NAMES = list(CODECS)


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
        flat = tensor.view(-1) if tensor.is_contiguous() else tensor.reshape(-1)
        if plan is not None:
            self._reduce_channels(flat.view(-1, plan.hidden), plan, path)
        else:
            self._reduce_flat(flat, path)
        if not tensor.is_contiguous():
            tensor.copy_(flat.view(tensor.shape))
        return tensor

    def _reduce_channels(self, x: torch.Tensor, plan: ChannelPlan, path: str) -> None:
        """In place on a contiguous ``[tokens, hidden]`` tensor: the outlier channels travel raw
        (summed in float32 in rank order) while the rest, zeroed there and block-transformed, takes
        the codec's path; then merged. One-shot: one all-gather of both; two-shot: rounds of whole
        tokens (``twoshot.two_shot_channels``)."""
        if path == "oneshot":  # one collective: the outlier channels ride with the encoded rest
            one_shot_channels(x, self.codec, plan, self.group, out=x.view(-1),
                              workspace=self._workspaces[0] if self._workspaces else None)
        else:
            two_shot_channels(x, self.codec, plan, self.group, out=x, workspaces=self._workspaces,
                              step_values=self._chunk_elems(4), depth=self.pipeline_depth)

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
