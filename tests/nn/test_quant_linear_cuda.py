"""A packed QuantLinear and the INT4 KV cache moved to a GPU compute what they compute on the CPU."""

import torch

from lowbit.nn import QuantLinear
from lowbit.formats.scheme import ActArgs, WeightArgs
from lowbit.formats.quantized_weight import rtn
from tests.cuda import needs_cuda

pytestmark = needs_cuda


def test_quant_linear_on_cuda_equals_cpu():
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(0)
    w = torch.randn(96, 300) * 0.05
    qw = rtn(w, WeightArgs(bits=4, group_size=128), n_outliers=16)
    m = QuantLinear.from_quantized(qw, ActArgs(bits=4, group_size=128, clip_ratio=0.9), torch.randperm(300), torch.randn(96), "int8")
    x = torch.randn(4, 7, 300) * torch.linspace(0.1, 4, 300)
    want = m(x)
    got = m.to("cuda")(x.cuda()).cpu()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
