"""The plugin's input steps (reorder, block Hadamard) compute what lowbit's own layers compute."""

import pytest
import torch

from lowbit.accelerate import KernelLinear
from lowbit.formats.scheme import GPTQArgs
from lowbit.kernels import prepare
from lowbit.kernels.linear_params import from_quant_linear
from lowbit.nn.online_hadamard import InputHadamard
from lowbit.quantize import get_scheme, quantize_model
from lowbit.vllm_plugin.input_steps import input_steps
from tests.tiny_models import tiny_model

IDS = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))


def _served(ql, folded, x):
    """What the plugin's layer returns for x: the op's ``before``, then the kernel prepared as it prepares it."""
    in_kernel, before = input_steps(ql, folded)
    y = prepare(from_quant_linear(ql), "cpu", input_perm=in_kernel).batched(x if before is None else before(x))
    return y, in_kernel, before


@pytest.mark.parametrize("name", ["w4a4", "w4a4-rot"])
def test_served_linear_equals_lowbits_own(name):
    model = tiny_model("llama", hidden_size=256, intermediate_size=512)
    quantize_model(model, get_scheme(name).with_(gptq=GPTQArgs(enabled=False)), IDS, progress=False)
    down = model.model.layers[0].mlp.down_proj
    assert down.input_perm is not None and (down.input_transform is not None) == name.endswith("-rot")
    x = torch.randn(5, down.in_features)
    want = KernelLinear.from_quant_linear(down)(x)
    y, in_kernel, before = _served(down, False, x)
    assert torch.equal(y, want)
    # plain W4A4 reads x through the reorder in the kernel; with the block Hadamard the op gathers first
    assert (in_kernel is None) == (before is not None) == name.endswith("-rot")
    folded, _, _ = _served(down, True, x[:, down.input_perm])  # gate_up already wrote x in down_proj's order
    assert torch.equal(folded, want)
    torch.testing.assert_close(want, down(x), rtol=0, atol=1e-3 * float(want.abs().max()))  # the reference path


def test_a_transform_before_the_reorder_runs_first():
    model = tiny_model("llama", hidden_size=256, intermediate_size=512)
    quantize_model(model, get_scheme("w4a4").with_(gptq=GPTQArgs(enabled=False)), IDS, progress=False)
    down = model.model.layers[0].mlp.down_proj
    down.input_transform = InputHadamard(down.in_features)  # R4's place (the plan refuses it; the steps stay right)
    x = torch.randn(3, down.in_features)
    y, in_kernel, before = _served(down, False, x)
    assert in_kernel is not None and torch.equal(y, KernelLinear.from_quant_linear(down)(x))
