"""How a decoder is cut across W tensor-parallel ranks: which heads and MLP rows each rank holds.

The rule (checked before any rank starts):

* Query heads stay with the KV head they attend to. When there are at least as many KV heads as
  ranks, whole KV groups are dealt out as evenly as possible in order (3 KV groups of 3 heads on
  2 ranks: 2 groups + 1 group, so 6 + 3 query heads); no KV head is stored twice.
* With fewer KV heads than ranks, query heads are dealt out as evenly as possible in order and
  each rank keeps (replicates) the KV heads its query heads need. When a rank's query heads do
  not use its KV heads equally often, the KV heads are expanded to one per local query head so the
  local module is ordinary multi-head attention (same numbers, a little more memory).
* MLP rows (intermediate channels) are dealt out as evenly as possible in order; in a
  mixture-of-experts layer every expert's rows alike (each rank holds a slice of every expert, so
  routing needs no communication and the experts' partial sums are all-reduced once).
* Norms over the whole projected q and k (OLMo 2) keep the weights of the rank's heads; each KV
  head's sum of squares is counted by one rank only (:func:`owned_kv`), however often it is replicated.

Uneven shares are exact: the row-parallel partial sums just cover different numbers of terms.
A split is impossible (clear ``TPSplitError``) when a rank would get no query head or no MLP row,
or when the architecture (:mod:`lowbit.models.architectures`) says what tensor parallelism lacks for it.
"""

from __future__ import annotations

from dataclasses import dataclass

from lowbit.errors import LowbitError

from .architectures import architecture, tp_types


class TPSplitError(LowbitError, ValueError):
    """The model cannot be split across the requested number of ranks."""


@dataclass(frozen=True)
class AttnShard:
    q_heads: tuple[int, ...]  # global query-head indices, in order
    kv_heads: tuple[int, ...]  # global KV-head index of each local KV head (repeats when expanded)
    groups: int  # local query heads per local KV head

    def check(self, rep: int) -> None:
        for i, h in enumerate(self.q_heads):
            assert self.kv_heads[i // self.groups] == h // rep, (self, rep)


def even_ranges(n: int, world: int) -> list[tuple[int, int]]:
    """``world`` consecutive ranges covering 0..n-1, sizes differing by at most one (larger first)."""
    base, extra = divmod(n, world)
    out, lo = [], 0
    for r in range(world):
        hi = lo + base + (1 if r < extra else 0)
        out.append((lo, hi))
        lo = hi
    return out


def attention_plan(n_heads: int, n_kv: int, world: int) -> list[AttnShard]:
    """The attention shard of every rank (see the module docstring for the rule)."""
    if world < 1:
        raise TPSplitError(f"the number of ranks must be >= 1, got {world}")
    if n_kv < 1 or n_heads % n_kv:
        raise TPSplitError(f"{n_heads} attention heads are not a multiple of {n_kv} KV heads")
    if n_heads < world:
        raise TPSplitError(f"cannot split {n_heads} attention heads over {world} ranks: a rank would hold no head")
    rep = n_heads // n_kv
    shards = []
    if n_kv >= world:
        for lo, hi in even_ranges(n_kv, world):
            shards.append(AttnShard(tuple(range(lo * rep, hi * rep)), tuple(range(lo, hi)), rep))
    else:
        for lo, hi in even_ranges(n_heads, world):
            heads = tuple(range(lo, hi))
            kvs = [h // rep for h in heads]
            distinct = sorted(set(kvs))
            counts = {kvs.count(k) for k in distinct}
            if len(counts) == 1:
                shards.append(AttnShard(heads, tuple(distinct), counts.pop()))
            else:
                shards.append(AttnShard(heads, tuple(kvs), 1))
    for s in shards:
        s.check(rep)
    return shards


@dataclass(frozen=True)
class TPPlan:
    world: int
    attn: list[AttnShard]
    mlp: list[tuple[int, int]]  # intermediate rows of each rank
    head_dim: int
    model_type: str  # its architecture says which linears are split and how (fused ones by parts)
    n_heads: int
    n_kv: int
    intermediate: int
    n_experts: int = 0  # per MoE layer (0: a dense model)
    expert_mlp: tuple[tuple[int, int], ...] = ()  # each expert's intermediate rows of each rank
    expert_intermediate: int = 0

    def describe(self) -> str:
        parts = [f"rank {r}: {len(a.q_heads)} q heads, {len(a.kv_heads)} kv heads, mlp rows {lo}..{hi - 1}"
                 + (f", rows {self.expert_mlp[r][0]}..{self.expert_mlp[r][1] - 1} of {self.n_experts} experts"
                    if self.n_experts else "")
                 for r, (a, (lo, hi)) in enumerate(zip(self.attn, self.mlp))]
        return "; ".join(parts)


def make_plan(config, world: int) -> TPPlan:
    """Check that ``config`` (a transformers config) can be split over ``world`` ranks; the plan."""
    mt = getattr(config, "model_type", None)
    arch = architecture(mt)  # UnsupportedArchitectureError for a model type lowbit does not know
    if arch.tp_missing:
        raise TPSplitError(f"tensor parallelism supports {', '.join(tp_types())} models, not model_type={mt!r}: "
                           f"{arch.tp_missing}")
    n_heads = config.num_attention_heads
    n_kv = getattr(config, "num_key_value_heads", None) or n_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // n_heads
    inter = config.intermediate_size
    if inter < world:
        raise TPSplitError(f"cannot split an MLP of {inter} channels over {world} ranks")
    moe = {}
    if arch.is_moe:
        n_experts = getattr(config, "num_local_experts", None) or config.num_experts
        e_inter = getattr(config, "moe_intermediate_size", None) or inter
        if e_inter < world:
            raise TPSplitError(f"cannot split experts of {e_inter} channels over {world} ranks")
        moe = dict(n_experts=n_experts, expert_mlp=tuple(even_ranges(e_inter, world)), expert_intermediate=e_inter)
    return TPPlan(world, attention_plan(n_heads, n_kv, world), even_ranges(inter, world), head_dim, mt, n_heads,
                  n_kv, inter, **moe)


Ranges = list[tuple[int, int]]


def _merge(ranges: Ranges) -> Ranges:
    out: Ranges = []
    for lo, hi in ranges:
        if out and out[-1][1] == lo:
            out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return out


def column_rows(plan: TPPlan, rank: int, moe: bool = False) -> dict[str, Ranges]:
    """The output rows (``[lo, hi)`` ranges, in order) that rank ``rank`` keeps of every
    column-parallel linear (paths inside a decoder layer; ``moe``: a mixture-of-experts layer): q
    heads, the KV heads they use (some repeated when expanded), MLP rows. A fused q|k|v or
    gate|up linear (every expert's gate|up) keeps each part's rows."""
    arch = architecture(plan.model_type)
    a, hd = plan.attn[rank], plan.head_dim

    def heads(hs, base: int = 0) -> Ranges:
        return [((base + h) * hd, (base + h + 1) * hd) for h in hs]

    q, kv = heads(a.q_heads), heads(a.kv_heads)
    if arch.fused_attention:
        attn = {arch.attention[0]: q + heads(a.kv_heads, plan.n_heads) + heads(a.kv_heads, plan.n_heads + plan.n_kv)}
    else:
        attn = dict(zip(arch.attention, (q, kv, kv)))
    lo, hi = plan.mlp[rank]
    if moe:
        lo, hi = plan.expert_mlp[rank]
        n = plan.expert_intermediate
        mlp = {p: [(lo, hi), (n + lo, n + hi)] for p in arch.experts.gate_ups(plan.n_experts)}
    elif arch.fused_mlp:
        mlp = {arch.mlp_in[0]: [(lo, hi), (plan.intermediate + lo, plan.intermediate + hi)]}
    else:
        mlp = {p: [(lo, hi)] for p in arch.mlp_in}
    return {p: _merge(r) for p, r in {**attn, **mlp}.items()}


def row_columns(plan: TPPlan, rank: int, moe: bool = False) -> dict[str, tuple[int, int]]:
    """The input columns ``[lo, hi)`` rank ``rank`` keeps of each row-parallel linear (in a
    mixture-of-experts layer: of every expert's down projection)."""
    a, hd = plan.attn[rank], plan.head_dim
    arch = architecture(plan.model_type)
    attention_out, mlp_out = arch.row_parallel()
    mlp = {p: plan.expert_mlp[rank] for p in arch.experts.downs(plan.n_experts)} if moe else {mlp_out: plan.mlp[rank]}
    return {attention_out: (a.q_heads[0] * hd, (a.q_heads[-1] + 1) * hd), **mlp}


def owned_kv(plan: TPPlan, rank: int) -> list[bool]:
    """For each local KV head of rank ``rank``: whether this rank counts it in a statistic summed
    over ranks (its first copy on the lowest rank holding it), so that every KV head counts once."""
    owner: dict[int, int] = {}
    for r, a in enumerate(plan.attn):
        for h in a.kv_heads:
            owner.setdefault(h, r)
    kv = plan.attn[rank].kv_heads
    return [owner[h] == rank and kv.index(h) == i for i, h in enumerate(kv)]


def row_parallel_splits(config, world: int) -> dict[str, list[int]]:
    """Input widths of each rank's slice of the row-parallel linears (paths inside a decoder
    layer): what TP-aware quantization keeps local to each rank."""
    plan = make_plan(config, world)
    arch = architecture(config.model_type)
    attention_out, mlp_out = arch.row_parallel()
    experts = {p: [hi - lo for lo, hi in plan.expert_mlp] for p in arch.experts.downs(plan.n_experts)} if arch.is_moe else {}
    return {
        attention_out: [len(a.q_heads) * plan.head_dim for a in plan.attn],
        mlp_out: [hi - lo for lo, hi in plan.mlp],
        **experts,
    }
