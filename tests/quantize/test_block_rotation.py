"""``rotation.block``: a Hadamard inside the INT4 blocks of each linear's normal channels, after
the outlier permutation. The permute-only model (float weights) computes the original function;
the packed model keeps the transform through save/load and the CPU kernels; the outlier channels
are never mixed in; exports and --tp refuse it.

Bound: permute-only logits within 2e-5·max|logit| of the float model (each weight rotated in
float64 and rounded once to fp32, as in test_rotation.py; observed ≈ 1e-6).
"""

import pytest
import torch

from lowbit.accelerate import accelerate
from lowbit.checkpoint import load_quantized, save_quantized
from lowbit.export import ExportError, export_compressed_tensors
from lowbit.formats.hadamard import fast_transform
from lowbit.formats.scheme import RotationArgs, SchemeError, TPArgs
from lowbit.nn import QuantLinear
from lowbit.nn.online_hadamard import BlockHadamard, OnlineTransformError, transform_from_dict
from lowbit.quantize import get_scheme, quantize_model
from lowbit.quantize.block_rotation import block_rotate
from lowbit.quantize.overrides import apply_overrides
from tests.tiny_models import TINY_ARCHS, tiny_model

IDS = torch.randint(0, 128, (2, 24), generator=torch.Generator().manual_seed(0))
REL = 2e-5


def _logits(model):
    with torch.no_grad():
        return model(IDS).logits


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_permute_only_model_with_blocks_equals_the_original(arch):
    scheme = apply_overrides(get_scheme("w4a4"), ["rotation.block=32", "outliers.count=8"])
    model = tiny_model(arch)
    ref = _logits(model)
    quantize_model(model, scheme, IDS, progress=False, permute_only=True)
    mods = [m for m in model.modules() if isinstance(m, QuantLinear)]
    assert mods and all(m.layout.input_transform["kind"] == "block-hadamard" for m in mods)
    assert (_logits(model) - ref).abs().max() <= REL * ref.abs().max()


def test_the_outlier_channels_are_left_alone_and_blocks_are_hadamard():
    t = BlockHadamard(20, 16, 8)
    x = torch.randn(3, 20)
    y = t(x)
    assert torch.equal(y[:, 16:], x[:, 16:])
    assert torch.allclose(y[:, :8], fast_transform(x[:, :8]), atol=1e-6)
    assert torch.allclose(y[:, 8:16], fast_transform(x[:, 8:16]), atol=1e-6)
    assert BlockHadamard.block_for(1472, 128) == 64 and BlockHadamard.block_for(512, 128) == 128
    assert BlockHadamard.block_for(15, 128) == 1


def test_rotated_hessian_matches_rotated_inputs():
    x = torch.randn(50, 24, dtype=torch.float64)
    w = torch.randn(5, 24, dtype=torch.float64)
    ws, hs, t = block_rotate([w], [x.T @ x], 8, RotationArgs(block=16))
    assert t is not None and t.block == 16 and t.normal == 16
    xr = t(x)
    assert torch.allclose(hs[0], xr.T @ xr, atol=1e-9)
    assert torch.allclose(xr @ ws[0].T, x @ w.T, atol=1e-9)
    assert block_rotate([w], [x.T @ x], 8, RotationArgs())[2] is None


def test_packed_model_keeps_blocks_through_save_load_and_kernels(tmp_path):
    scheme = apply_overrides(get_scheme("w4a4"), ["rotation.block=128", "outliers.count=8"])
    model = tiny_model("llama")
    quantize_model(model, scheme, IDS, progress=False)
    q = model.model.layers[0].self_attn.q_proj
    assert q.layout.input_transform == {"kind": "block-hadamard", "n": 64, "normal": 56, "block": 8}
    got = _logits(model)
    save_quantized(model, tmp_path / "q")
    again, _ = load_quantized(tmp_path / "q")
    assert torch.equal(_logits(again), got)
    accelerate(again)
    down = again.model.layers[0].mlp.down_proj
    assert type(down).__name__ == "KernelLinear" and down.input_transform is not None
    assert (_logits(again) - got).abs().max() <= 1e-3 * got.abs().max()
    for m in model.modules():
        if isinstance(m, QuantLinear):
            m.input_transform = None
    assert (_logits(model) - got).abs().max() > 0.05 * got.abs().max()  # the transform is load-bearing


def test_refusals(tmp_path):
    for bad in (-2, 1, 3, 1.5, True):
        with pytest.raises(SchemeError, match="rotation.block"):
            RotationArgs(block=bad)
    with pytest.raises(SchemeError, match="pick one"):
        get_scheme("w4a4").with_(rotation=RotationArgs(kind="hadamard", r4=True, block=64))
    with pytest.raises(SchemeError, match="tensor parallelism"):
        get_scheme("w4a4").with_(rotation=RotationArgs(block=64), tensor_parallel=TPArgs(world=2))
    for d in ({"kind": "block-hadamard", "n": 8, "normal": 8, "block": 3},
              {"kind": "block-hadamard", "n": 8, "normal": 6, "block": 4}, {"kind": "block-hadamard", "n": 8}):
        with pytest.raises(OnlineTransformError):
            transform_from_dict(d)
    scheme = apply_overrides(get_scheme("w4a16"), ["rotation.block=32", "weights.group_size=32", "lm_head.bits=16"])
    model = tiny_model("llama")
    quantize_model(model, scheme, IDS, progress=False)
    with pytest.raises(ExportError, match="online block-hadamard"):
        export_compressed_tensors(model, tmp_path / "out")
