"""What the vLLM plugin will run for a lowbit checkpoint, decided from ``lowbit_config.json`` alone
(no vLLM here): one :class:`QuantLinearLayout` per vLLM linear (q/k/v and gate/up fused, as vLLM
builds them), where each input permutation lives, and every reason to refuse the checkpoint.

Everything the plugin cannot run is refused here, so vLLM fails while loading, never at a
request: kernels without a lowbit CPU path (FP4 grids, FP16 outliers, float "linears" of
activation-only schemes, asymmetric activations), R4's online Hadamard (the ``-rot`` presets'
block Hadamard is served: the op applies it), mixture-of-experts, norms other than a decoder
layer's two, and a tensor-parallel size other than the one the checkpoint was quantized for. The
INT4 KV cache is the one thing served differently: vLLM's paged cache holds one dtype per element,
not lowbit's packed codes with a scale and zero per token and head, so the plugin serves with
vLLM's own cache dtype and says so.

Where the reorder goes: lowbit folds each decoder layer's input permutation into its two norms
(:class:`lowbit.nn.PermutedNorm`); vLLM's Llama uses its own fused add+RMSNorm, so the plugin
loads the norm's plain weight there and gives the permutation to the fused linear it feeds
(qkv_proj, gate_up_proj), which gathers its input first, as o_proj and down_proj already do.

Tensor parallelism: column-parallel linears (q/k/v, gate/up, a quantized LM head) split by output
rows, which any checkpoint allows. The row-parallel o_proj and down_proj split by input channels,
which a one-rank checkpoint's groups, outlier channels and permutation span; a checkpoint made by
``lowbit quantize --tp W`` holds them as W independent parts, one per rank's input slice
(:mod:`lowbit.quantize.row_shards`), so rank r loads ``<name>.parts.<r>`` as its whole layer.
Hence: a ``--tp W`` checkpoint is served with ``tensor_parallel_size=W``, a one-rank one with 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from lowbit.errors import LowbitError
from lowbit.formats.scheme import Scheme, SchemeError, is_int
from lowbit.kernels.linear_params import ActSpec, KernelError, kind_of
from lowbit.nn.online_hadamard import BLOCK_KIND
from lowbit.nn.quant_linear import QuantLinearLayout

NAME = "lowbit"
MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")  # vLLM models with qkv_proj / gate_up_proj as below
FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
# the norm whose permuted output a fused linear reads, and where the checkpoint's ``perm`` goes
NORM_OF = {"qkv_proj": "input_layernorm", "gate_up_proj": "post_attention_layernorm"}
PERM_TARGET = {"input_layernorm": "self_attn.q_proj", "post_attention_layernorm": "mlp.gate_proj"}
KV_CACHE_NOTE = ("lowbit: this checkpoint's INT{bits} KV cache (packed codes, a scale and zero per token and head) "
                 "cannot live in vLLM's paged KV cache; serving with vLLM's own cache dtype "
                 "(kv_cache_dtype='auto': the model dtype)")


class PluginError(LowbitError, ValueError):
    """A lowbit checkpoint the vLLM plugin cannot serve (the message says which part and why)."""


@dataclass(frozen=True)
class Plan:
    scheme: Scheme
    linears: dict[str, QuantLinearLayout]  # checkpoint module name → layout
    permuted_norms: frozenset[str]
    row_sharded: dict[str, list[int]] = field(default_factory=dict)  # row-parallel linear → input slice widths

    @property
    def world(self) -> int:
        return self.scheme.tensor_parallel.world

    def check_tp(self, tp_size: int) -> None:
        """:class:`PluginError` unless vLLM's ``tensor_parallel_size`` is the one the checkpoint was made for."""
        if tp_size == self.world:
            return
        if self.world == 1:
            raise PluginError(f"tensor_parallel_size={tp_size}: this checkpoint was quantized for one rank, so the "
                              "groups, outlier channels and input permutation of its row-parallel linears (o_proj, "
                              "down_proj) span their whole input, which ranks cannot split; quantize it with "
                              f"`lowbit quantize --tp {tp_size}` for {tp_size} ranks, or serve with tensor_parallel_size=1")
        raise PluginError(f"tensor_parallel_size={tp_size}: this checkpoint was quantized for {self.world} "
                          f"tensor-parallel ranks (--tp {self.world}): serve it with tensor_parallel_size={self.world}, "
                          f"or quantize again with `lowbit quantize --tp {tp_size}`")

    def weight_renames(self, rank: int) -> dict[str, str | None]:
        """Regex → replacement (None: skip) for checkpoint names: rank ``rank`` loads its own part
        of each row-sharded linear as the layer itself and skips the other ranks' parts."""
        if not self.row_sharded:
            return {}
        return {rf"\.parts\.{rank}\.": ".", r"\.parts\.\d+\.": None}

    @property
    def kv_cache_note(self) -> str | None:
        kv = self.scheme.kv_cache
        return KV_CACHE_NOTE.format(bits=kv.bits) if kv.bits < 16 else None

    def layer(self, prefix: str, rank: int = 0) -> tuple[QuantLinearLayout, list[int]] | None:
        """The layout of vLLM's linear at ``prefix`` on tensor-parallel rank ``rank`` (fused parts
        stacked along the output, each whole: vLLM's split of the rows is applied when loading)
        and its parts' output sizes; None if the checkpoint keeps it float. Its ``has_input_perm``
        says whether the layer gathers its input (its own permutation, or its norm's). A
        row-sharded linear is its part ``rank``: that rank's input slice only."""
        head, _, proj = prefix.rpartition(".")
        names = [f"{head}.{p}" if head else p for p in FUSED.get(proj, (proj,))]
        names = [f"{n}.parts.{rank}" if n in self.row_sharded else n for n in names]
        parts = [self.linears.get(n) for n in names]
        if all(p is None for p in parts):
            return None
        if any(p is None for p in parts):
            raise PluginError(f"{prefix}: vLLM fuses {', '.join(names)} but the checkpoint quantizes only some of them")
        first = parts[0]
        for n, p in zip(names[1:], parts[1:]):
            if replace(p, out_features=first.out_features) != first:
                raise PluginError(f"{prefix}: {names[0]} and {n} have different layouts ({first} vs {p}); "
                                  "vLLM runs them as one fused linear")
        norm = f"{head.rpartition('.')[0]}.{NORM_OF[proj]}" if proj in NORM_OF else None
        from_norm = norm in self.permuted_norms
        if from_norm and first.has_input_perm:
            raise PluginError(f"{prefix}: both its norm and the linear itself permute the input")
        sizes = [p.out_features for p in parts]
        return replace(first, out_features=sum(sizes), has_bias=False,
                       has_input_perm=first.has_input_perm or from_norm), sizes


def plan_from_meta(meta: dict) -> Plan:
    """Check a ``lowbit_config.json`` for what the plugin runs; :class:`PluginError` otherwise."""
    if not isinstance(meta, dict) or "scheme" not in meta:
        raise PluginError("not a lowbit_config.json: no 'scheme' (serve a folder written by `lowbit quantize`)")
    try:
        scheme = Scheme.from_dict(meta["scheme"])
    except (SchemeError, TypeError) as e:
        raise PluginError(f"lowbit_config.json: bad scheme: {e}") from e
    layout = _checked_layout(meta.get("layout", {}), scheme)
    row_sharded = {}
    for name, d in (layout.get("row_sharded") or {}).items():
        splits = d.get("splits") if isinstance(d, dict) else None
        if not isinstance(splits, list) or len(splits) != scheme.tensor_parallel.world:
            raise PluginError(f"lowbit_config.json: {name} is cut into {splits!r} input slices, the scheme says "
                              f"{scheme.tensor_parallel.world} ranks")
        if not all(is_int(x) and x > 0 for x in splits):
            raise PluginError(f"lowbit_config.json: layout.row_sharded.{name}.splits must be positive integers, "
                              f"got {splits!r}")
        if d.get("has_bias"):
            raise PluginError(f"{name}: a row-sharded linear with a bias; the plugin serves row-parallel linears "
                              "without one (llama / mistral / qwen2 / qwen3 have none)")
        row_sharded[name] = [int(x) for x in splits]
    if layout.get("unfused_experts"):
        raise PluginError("mixture-of-experts checkpoints are not served by the lowbit plugin (vLLM's fused MoE "
                          "layers have no lowbit kernel)")
    norms = frozenset(layout.get("permuted_norms", []))
    for n in norms:
        if n.rpartition(".")[2] not in PERM_TARGET:
            raise PluginError(f"permuted norm {n}: the plugin moves only decoder layers' "
                              f"{' and '.join(PERM_TARGET)} permutations into vLLM's linears")
    linears = {}
    for name, d in layout.get("quant_linears", {}).items():
        try:
            lay = QuantLinearLayout.from_dict(d)
        except TypeError as e:
            raise PluginError(f"lowbit_config.json: bad layout of {name}: {e}") from e
        check_runnable(name, lay)
        linears[name] = lay
    for name, splits in row_sharded.items():
        for r, width in enumerate(splits):
            part = linears.get(f"{name}.parts.{r}")
            if part is None or part.in_features != width:
                raise PluginError(f"{name}: part {r} of its {len(splits)} input slices is missing or not "
                                  f"{width} channels wide")
    return Plan(scheme, linears, norms, row_sharded)


def _checked_layout(layout, scheme: Scheme) -> dict:
    """``layout`` with the types the plan reads (vLLM calls the plan before the checkpoint's hashes
    are checked, so a malformed file must be a :class:`PluginError` naming the field, not a crash),
    and consistent with ``scheme`` as lowbit's loader requires (:func:`check_layout`)."""
    from lowbit.checkpoint.layout import check_layout

    def need(ok: bool, field: str, what: str, got) -> None:
        if not ok:
            raise PluginError(f"lowbit_config.json: {field} must be {what}, got {got!r}"[:300])

    need(isinstance(layout, dict), "layout", "an object", layout)
    for key in ("quant_linears", "row_sharded"):
        need(isinstance(layout.get(key, {}), dict), f"layout.{key}", "an object", layout.get(key))
    norms = layout.get("permuted_norms", [])
    need(isinstance(norms, list) and all(isinstance(n, str) for n in norms), "layout.permuted_norms",
         "a list of module names", norms)
    for name, d in layout.get("quant_linears", {}).items():
        need(isinstance(d, dict), f"layout.quant_linears.{name}", "an object", d)
        act = d.get("act")
        need(act is None or isinstance(act, dict), f"layout.quant_linears.{name}.act", "an object or null", act)
        if act is not None:
            need(is_int(act.get("bits")), f"layout.quant_linears.{name}.act.bits", "an integer", act.get("bits"))
    try:
        check_layout(layout, scheme)
    except (ValueError, TypeError, AttributeError) as e:
        raise PluginError(f"lowbit_config.json: {e}") from e
    return layout


def check_runnable(name: str, lay: QuantLinearLayout) -> str:
    """The kernel kind lowbit's CPU kernels run ``lay`` with, or :class:`PluginError` saying why not."""
    if lay.w_bits == 16:
        raise PluginError(f"{name}: float weights with quantized activations (an activation-only scheme) have "
                          "no lowbit kernel")
    if lay.w_format != "int":
        raise PluginError(f"{name}: {lay.w_format} weights have no lowbit CPU kernel (integer grids only)")
    if lay.input_transform and lay.input_transform.get("kind") != BLOCK_KIND:  # R4's whole-input Hadamard
        raise PluginError(f"{name}: an online {lay.input_transform.get('kind')} transform of its input "
                          f"(rotation.r4); the plugin applies only the -rot presets' {BLOCK_KIND} "
                          "(rotation.block): re-quantize without rotation.r4")
    if lay.n_outliers and lay.outlier_precision != "int8":
        raise PluginError(f"{name}: {lay.outlier_precision} outlier channels; the kernels take INT8 outliers only")
    act = None
    if lay.act is not None:
        a = lay.act
        if a.get("format", "int") != "int" or not a.get("symmetric", True):
            raise PluginError(f"{name}: activations {a.get('format')} symmetric={a.get('symmetric')}; the kernels "
                              "quantize activations to symmetric integers only")
        act = ActSpec(a["bits"], a.get("group_size", 0), a.get("clip_ratio", 1.0), a.get("scale_rule", "signed"))
    try:
        return kind_of(lay.w_bits, act)
    except KernelError as e:
        raise PluginError(f"{name}: {e} (kernels: W4A16, W8A16, W8A8, W4A4)") from e


def unverified_note(model_name: str) -> str | None:
    """The warning for a model vLLM takes by hub id rather than a local folder: when vLLM asks the
    plugin (``maybe_update_config``) it has fetched only the id's JSON files, so lowbit's hashes of
    the tensors cannot be checked; None for a local folder, which is verified as lowbit's loader
    verifies it."""
    if Path(model_name).is_dir():
        return None
    return (f"lowbit plugin: {model_name!r} is not a local folder, so its checkpoint hashes are not checked "
            "(vLLM has not fetched its tensors yet); serve a local copy to have them verified")


def check_model_type(model_type: str | None) -> None:
    if model_type not in MODEL_TYPES:
        raise PluginError(f"model type {model_type!r}: the lowbit plugin serves {', '.join(MODEL_TYPES)} "
                          "(vLLM models whose linears it maps)")


def norm_renames() -> dict[str, str]:
    """Regex → replacement for checkpoint names: a permuted norm's weight to vLLM's norm, its
    permutation to the first linear it feeds (vLLM then stacks it into the fused linear)."""
    out = {}
    for norm, target in PERM_TARGET.items():
        out[rf"\.{norm}\.norm\.weight$"] = f".{norm}.weight"
        out[rf"\.{norm}\.perm$"] = f".{target}.input_perm"
    return out
