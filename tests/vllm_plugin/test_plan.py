"""The plugin's plan from lowbit_config.json alone (lowbit's environment, no vLLM): fused layouts,
where the permutations go, and every checkpoint it refuses, with the reason."""

import json
import re

import pytest
import torch

from lowbit.checkpoint import save_quantized
from lowbit.formats.scheme import KVArgs, TPArgs
from lowbit.quantize import get_scheme, quantize_model
from lowbit.vllm_plugin.plan import PluginError, check_model_type, norm_renames, plan_from_meta, unverified_note
from tests.tiny_models import tiny_model

IDS = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))


def _meta(tmp_path_factory, scheme, arch="llama"):
    model = tiny_model(arch)
    quantize_model(model, scheme, IDS, progress=False)
    out = tmp_path_factory.mktemp("ckpt") / "q"
    save_quantized(model, out)
    return json.loads((out / "lowbit_config.json").read_text())


@pytest.fixture(scope="module")
def w4a4(tmp_path_factory):
    return _meta(tmp_path_factory, get_scheme("w4a4-rtn").with_(outliers=get_scheme("w4a4").outliers))


def test_w4a4_fused_layouts_and_permutations(w4a4):
    plan = plan_from_meta(w4a4)
    assert plan.kv_cache_note is None
    qkv, sizes = plan.layer("model.layers.0.self_attn.qkv_proj")
    assert sizes == [64, 32, 32] and qkv.out_features == 128 and qkv.n_outliers == 8
    assert qkv.has_input_perm  # its norm's permutation moves into the fused linear
    assert not w4a4["layout"]["quant_linears"]["model.layers.0.self_attn.q_proj"]["has_input_perm"]
    gate_up, sizes = plan.layer("model.layers.1.mlp.gate_up_proj")
    assert sizes == [128, 128] and gate_up.has_input_perm
    o, sizes = plan.layer("model.layers.0.self_attn.o_proj")
    assert sizes == [64] and o.has_input_perm  # its own permutation, in the checkpoint already
    assert plan.layer("lm_head") is None  # the head stays float: vLLM's own


def test_renames_move_norm_permutations_to_the_linear_they_feed():
    names = {"model.layers.3.input_layernorm.norm.weight": "model.layers.3.input_layernorm.weight",
             "model.layers.3.input_layernorm.perm": "model.layers.3.self_attn.q_proj.input_perm",
             "model.layers.3.post_attention_layernorm.perm": "model.layers.3.mlp.gate_proj.input_perm",
             "model.layers.3.self_attn.o_proj.input_perm": "model.layers.3.self_attn.o_proj.input_perm",
             "model.norm.weight": "model.norm.weight"}
    for name, want in names.items():
        for pat, new in norm_renames().items():
            name = re.sub(pat, new, name)
        assert name == want


def test_int4_kv_cache_is_served_with_vllms_cache_and_says_so(tmp_path_factory):
    meta = _meta(tmp_path_factory, get_scheme("w4a4-rtn").with_(kv_cache=KVArgs(bits=4)))
    note = plan_from_meta(meta).kv_cache_note
    assert "INT4 KV cache" in note and "kv_cache_dtype='auto'" in note


def test_the_main_jobs_checkpoint_is_served_with_its_block_hadamard_and_vllms_cache(tmp_path_factory):
    """w4a4-kv4-rot: every linear's block Hadamard is applied by the op; the INT4 cache is vLLM's own."""
    from lowbit.formats.scheme import GPTQArgs

    plan = plan_from_meta(_meta(tmp_path_factory, get_scheme("w4a4-kv4-rot").with_(gptq=GPTQArgs(enabled=False))))
    assert "INT4 KV cache" in plan.kv_cache_note
    for prefix in ("model.layers.0.self_attn.qkv_proj", "model.layers.0.self_attn.o_proj",
                   "model.layers.0.mlp.gate_up_proj", "model.layers.0.mlp.down_proj"):
        layout, _ = plan.layer(prefix)
        assert layout.input_transform["kind"] == "block-hadamard" and layout.has_input_perm, prefix


def test_tp_checkpoint_gives_each_rank_its_part_of_the_row_parallel_linears(w4a4, tmp_path_factory):
    """A ``--tp 2`` checkpoint: rank r's o_proj / down_proj is part r (its own input slice, outliers
    and permutation), read under the layer's name; column-parallel layers are whole (vLLM's rows
    are cut when loading); and each checkpoint is served only at the size it was made for."""
    meta = _meta(tmp_path_factory, get_scheme("w4a4-rtn").with_(outliers=get_scheme("w4a4").outliers,
                                                                tensor_parallel=TPArgs(world=2)))
    plan = plan_from_meta(meta)
    splits = meta["layout"]["row_sharded"]["model.layers.0.mlp.down_proj"]["splits"]
    assert plan.world == 2 and len(splits) == 2
    for rank in (0, 1):
        down, sizes = plan.layer("model.layers.0.mlp.down_proj", rank)
        assert down.in_features == splits[rank] and sizes == [down.out_features] and down.has_input_perm
        qkv, sizes = plan.layer("model.layers.0.self_attn.qkv_proj", rank)
        assert sizes == [64, 32, 32] and qkv.in_features == 64  # whole: the rows are vLLM's to cut
    renames = plan.weight_renames(1)
    for name, want in {"model.layers.0.mlp.down_proj.parts.1.qweight": "model.layers.0.mlp.down_proj.qweight",
                       "model.layers.0.mlp.down_proj.parts.0.qweight": None,
                       "model.layers.0.mlp.up_proj.qweight": "model.layers.0.mlp.up_proj.qweight"}.items():
        for pat, new in renames.items():
            if name is not None and re.search(pat, name):
                name = None if new is None else re.sub(pat, new, name)
        assert name == want
    plan.check_tp(2)
    with pytest.raises(PluginError, match="quantized for 2 tensor-parallel ranks .* tensor_parallel_size=2"):
        plan.check_tp(1)
    with pytest.raises(PluginError, match="quantized for one rank.*`lowbit quantize --tp 2`"):
        plan_from_meta(w4a4).check_tp(2)
    assert plan_from_meta(w4a4).weight_renames(0) == {}
    bad = json.loads(json.dumps(meta))
    bad["layout"]["row_sharded"]["model.layers.0.mlp.down_proj"]["splits"] = splits + [8]
    with pytest.raises(PluginError, match=r"down_proj is cut into .* input slices, the scheme says 2 ranks"):
        plan_from_meta(bad)
    bad = json.loads(json.dumps(meta))
    del bad["layout"]["quant_linears"]["model.layers.0.self_attn.o_proj.parts.1"]
    with pytest.raises(PluginError, match="o_proj: part 1 of its 2 input slices is missing"):
        plan_from_meta(bad)


def test_refused_checkpoints_name_the_reason(w4a4, tmp_path_factory):
    bad = json.loads(json.dumps(w4a4))
    bad["layout"]["unfused_experts"] = True
    with pytest.raises(PluginError, match="mixture-of-experts"):
        plan_from_meta(bad)
    bad = json.loads(json.dumps(w4a4))
    bad["layout"]["quant_linears"]["model.layers.0.self_attn.k_proj"]["n_outliers"] = 4
    with pytest.raises(PluginError, match="different layouts"):
        plan_from_meta(bad).layer("model.layers.0.self_attn.qkv_proj")
    bad = json.loads(json.dumps(w4a4))
    del bad["layout"]["quant_linears"]["model.layers.0.mlp.up_proj"]
    with pytest.raises(PluginError, match="only some"):
        plan_from_meta(bad).layer("model.layers.0.mlp.gate_up_proj")
    bad = json.loads(json.dumps(w4a4))
    bad["layout"]["quant_linears"]["model.layers.0.mlp.down_proj"]["input_transform"] = {"kind": "hadamard", "n": 128}
    with pytest.raises(PluginError, match="down_proj: an online hadamard transform of its input"):
        plan_from_meta(bad)
    block = {"kind": "block-hadamard", "n": 1536, "normal": 1472, "block": 64}  # the -rot presets' transform: served
    bad["layout"]["quant_linears"]["model.layers.0.mlp.down_proj"]["input_transform"] = block
    assert plan_from_meta(bad).layer("model.layers.0.mlp.down_proj")[0].input_transform == block
    fp4 = _meta(tmp_path_factory, get_scheme("w4a4-fp4").with_(gptq=get_scheme("w4a4-rtn").gptq))
    with pytest.raises(PluginError, match="fp4 weights have no lowbit CPU kernel"):
        plan_from_meta(fp4)
    with pytest.raises(PluginError, match="no 'scheme'"):
        plan_from_meta({"format_version": 2})
    with pytest.raises(PluginError, match="model type 'gemma'"):
        check_model_type("gemma")


def test_vllm_is_imported_only_by_the_plugin_and_only_when_vllm_calls_it():
    """lowbit's own environment has no vLLM: importing lowbit (plugin package included) must not
    need it; only vllm_method.py (loaded by register()), the worker script and its linear timer import it."""
    import ast
    from pathlib import Path

    import lowbit.vllm_plugin
    import lowbit.vllm_plugin.plan
    import lowbit.vllm_plugin.runner  # noqa: F401

    root = Path(lowbit.vllm_plugin.__file__).parents[1]
    allowed = {"vllm_plugin/vllm_method.py", "vllm_plugin/worker.py", "vllm_plugin/linear_timer.py",
               "vllm_plugin/__init__.py",
               "bench/vllm_worker.py"}  # the export benchmark's own worker (runs in vLLM's environment)
    users = set()
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            if any(n.split(".")[0] == "vllm" for n in names):
                users.add(path.relative_to(root).as_posix())
    assert users <= allowed, sorted(users - allowed)
    top = [n for n in ast.parse((root / "vllm_plugin/__init__.py").read_text()).body
           if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert not any("vllm" in (getattr(n, "module", "") or "") for n in top)  # inside register() only


Q = "model.layers.0.self_attn.q_proj"


@pytest.mark.parametrize("edit,match", [
    (lambda m: m.update(layout=[]), "layout must be an object"),
    (lambda m: m["layout"].update(quant_linears=[]), "layout.quant_linears must be an object"),
    (lambda m: m["layout"]["quant_linears"].update({Q: 4}), f"layout.quant_linears.{Q} must be an object"),
    (lambda m: m["layout"]["quant_linears"][Q].update(act={"format": "int"}), f"{Q}.act.bits must be an integer"),
    (lambda m: m["layout"]["quant_linears"][Q].update(act=[4]), f"{Q}.act must be an object"),
    (lambda m: m["layout"].update(row_sharded=[1]), "layout.row_sharded must be an object"),
    (lambda m: m["layout"].update(row_sharded={"model.layers.0.self_attn.o_proj": {"splits": ["a"]}}),
     "o_proj.splits must be positive integers"),
    (lambda m: m["layout"].update(permuted_norms="model.layers.0.input_layernorm"), "permuted_norms must be a list"),
    (lambda m: m["layout"].update(bogus=1), "unknown layout key"),
    (lambda m: m["scheme"]["weights"].update(bits=8), "is stored as .*w_bits': 4.* but the scheme"),
    (lambda m: m["layout"]["quant_linears"][Q].update(w_bits="4"), "is stored as .*w_bits': '4'"),
])
def test_malformed_or_inconsistent_layouts_are_plugin_errors_naming_the_field(w4a4, edit, match):
    """vLLM plans before the checkpoint's hashes are checked: a malformed file must be refused by
    name, never crash with AttributeError / KeyError / ValueError, and a layout must fit its scheme."""
    bad = json.loads(json.dumps(w4a4))
    edit(bad)
    with pytest.raises(PluginError, match=match):
        plan_from_meta(bad)


def test_a_hub_id_is_served_with_a_warning_that_its_hashes_are_not_checked(tmp_path):
    """vLLM asks the plugin before it fetches a hub id's tensors, so only a local folder can be
    verified there; a hub id gets the warning (logged by the plugin), never a silent pass."""
    assert unverified_note(str(tmp_path)) is None
    note = unverified_note("someone/smollm2-w4a4")
    assert "not a local folder" in note and "someone/smollm2-w4a4" in note
