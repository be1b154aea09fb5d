"""The vectorised codecs run on the tensor's own device: on a GPU they must give the CPU
reference's exact bytes and values (this is the path QuickAllReduce takes under NCCL)."""

import pytest
import torch

from lowbit.comm.codecs import ROW, decode_ref, decode_torch, encode_ref, encode_torch
from tests.cuda import needs_cuda

pytestmark = needs_cuda


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("name", ["int8", "int6", "int4", "int3", "fp4"])
def test_cuda_codec_equals_cpu_reference(name, dtype):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(3 * ROW + 555, generator=g) * torch.exp(torch.randn(3 * ROW + 555, generator=g))).to(dtype)
    x[64:96] = 0
    wire = encode_torch(x.cuda(), name)
    ref = encode_ref(x, name)
    assert wire.is_cuda and torch.equal(wire.cpu(), ref)
    got = decode_torch(wire, name, x.numel(), torch.float32).cpu()
    want = decode_ref(ref, name, x.numel(), torch.float32)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("name", ["int8", "int4", "int3", "fp4"])
def test_cuda_extended_scales_equal_cpu_reference(name, dtype):
    """Blocks beyond the fp16 scale range (1e6, 3e38, bf16's max): the same bytes as on CPU."""
    x = torch.randn(ROW, generator=torch.Generator().manual_seed(1))
    for i, v in enumerate([1e6, -1e6, 3e38, 3.3895313892515355e38, 524033.0, 393121.0]):
        x[32 * i + i] = v
    x = x.to(dtype)
    wire = encode_torch(x.cuda(), name)
    ref = encode_ref(x, name)
    assert torch.equal(wire.cpu(), ref)
    got = decode_torch(wire, name, ROW, torch.float32).cpu()
    assert bool(torch.isfinite(got).all())
    assert torch.equal(got.view(torch.int32), decode_ref(ref, name, ROW, torch.float32).view(torch.int32))
