"""The kernels' activation quantizer must produce exactly the module's codes and scales."""

import pytest
import torch

from lowbit.kernels import ActSpec, quantize_tokens
from lowbit.nn.quantized_activation import quantize_activation
from lowbit.formats.scheme import ActArgs


@pytest.mark.parametrize("n_in,k,group,bits,clip", [(288, 32, 128, 4, 0.9), (256, 0, 128, 4, 1.0),
                                                    (200, 8, 64, 4, 1.0), (96, 0, 0, 8, 1.0)])
@pytest.mark.parametrize("rule", ["signed", "compressed-tensors"])
def test_equals_module_quantizer(n_in, k, group, bits, clip, rule):
    torch.manual_seed(1)
    x = torch.randn(7, n_in) * torch.rand(n_in) * 4
    x[2] = 0.0  # an all-zero token: scale 1, codes 0
    x[3, :5] = torch.tensor([2.0, -2.0, 1.0, 0.5, -0.5])  # ties in |x|: first index wins
    a = quantize_tokens(x, ActSpec(bits, group, clip, rule), k)
    ref = quantize_activation(x, ActArgs(bits=bits, group_size=group, symmetric=True, clip_ratio=clip,
                                         scale_rule=rule), k, "int8")
    offset = 2 ** (bits - 1)
    assert torch.equal(a.codes, (ref.codes.to(torch.int16) - offset).to(torch.int8))
    assert torch.equal(a.scale.reshape(-1), ref.scale)
    assert torch.equal(a.outlier, ref.outlier)
    assert torch.equal(a.outlier_scale, ref.outlier_scale)


def test_bad_inputs():
    with pytest.raises(ValueError, match="NaN"):
        quantize_tokens(torch.tensor([[1.0, float("nan")]]), ActSpec(4, 0))
    with pytest.raises(ValueError, match="tokens, features"):
        quantize_tokens(torch.ones(4), ActSpec(4, 0))
    with pytest.raises(TypeError, match="floating"):
        quantize_tokens(torch.ones(2, 4, dtype=torch.int32), ActSpec(4, 0))
    with pytest.raises(ValueError, match="outlier"):
        quantize_tokens(torch.ones(2, 4), ActSpec(4, 0), n_outliers=5)


def test_empty_tokens():
    a = quantize_tokens(torch.zeros(0, 160), ActSpec(4, 128), 32)
    assert a.codes.shape == (0, 128) and a.scale.shape == (0, 1) and a.outlier.shape == (0, 32)
