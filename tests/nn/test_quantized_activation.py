"""Per-token activation quantization on compressed-tensors' scale rule is that library's own dynamic
activation quantization (what transformers runs on an exported checkpoint), bit for bit."""

import pytest
import torch

pytest.importorskip("compressed_tensors", reason="needs the export extra (compressed-tensors==0.17.0)")

from compressed_tensors.quantization import QuantizationArgs  # noqa: E402
from compressed_tensors.quantization.lifecycle.forward import fake_quantize  # noqa: E402
from compressed_tensors.quantization.utils.helpers import compute_dynamic_scales_and_zp  # noqa: E402

from lowbit.formats.scheme import ActArgs  # noqa: E402
from lowbit.nn.quantized_activation import quantize_activation  # noqa: E402


@pytest.mark.parametrize("bits,group", [(8, 0), (4, 64), (8, 32)])
def test_compressed_tensors_rule_is_their_dynamic_quantization(bits, group):
    torch.manual_seed(bits + group)
    x = torch.randn(1, 9, 192) * torch.rand(192) * 5
    x[0, 1, 5], x[0, 2, 70] = 60.0, -60.0  # a token led by a positive absmax, one by a negative
    x[0, 3] = 0.0  # an all-zero token
    args = QuantizationArgs(num_bits=bits, type="int", symmetric=True, dynamic=True,
                            strategy="group" if group else "token", group_size=group or None)
    scale, zero = compute_dynamic_scales_and_zp(x, args, module=torch.nn.Identity())
    want = fake_quantize(x, scale, zero, args)[0]
    ours = ActArgs(bits=bits, group_size=group, scale_rule="compressed-tensors")
    assert torch.equal(quantize_activation(x[0], ours).dequantize(), want)
    # lowbit's own rule is a different grid: the positive absmax is exact there, clamped in theirs
    signed = quantize_activation(x[0], ActArgs(bits=bits, group_size=group)).dequantize()
    assert signed[1, 5] == 60.0 and want[1, 5] < 60.0


def test_scale_rule_is_checked():
    from lowbit.formats.scheme import SchemeError

    with pytest.raises(SchemeError, match="scale_rule must be one of"):
        ActArgs(bits=8, scale_rule="absmax")
    with pytest.raises(SchemeError, match="symmetric INT"):
        ActArgs(bits=4, format="fp4", scale_rule="compressed-tensors")
    with pytest.raises(SchemeError, match="symmetric INT"):
        ActArgs(bits=8, symmetric=False, scale_rule="compressed-tensors")
