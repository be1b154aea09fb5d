"""Triton kernels compiled for a real GPU against the CPU references (the same checks as the
interpreter tests, at model and Llama-7B shapes where tiling and masking really matter)."""

import pytest
import torch

from lowbit.kernels import ActSpec, from_float, quantize_tokens, reference
from tests.cuda import needs_cuda

pytestmark = needs_cuda
triton = pytest.importorskip("triton")

SHAPES = {  # tokens, out, in, outliers, group
    "smollm_qkv_t1": (1, 960, 576, 64, 128),
    "smollm_down_t37": (37, 576, 1536, 64, 128),
    "llama_t512": (512, 4096, 4096, 128, 128),
    "ragged_g64": (5, 200, 711, 8, 64),
}


@pytest.mark.parametrize("name", list(SHAPES))
def test_act_quant_on_gpu_equals_cpu_reference(name):
    from lowbit.kernels.triton.act_codes import quantize_tokens_triton

    t, _, n_in, k, g = SHAPES[name]
    torch.manual_seed(1)
    x = torch.randn(t, n_in) * torch.exp(torch.randn(n_in))
    perm = torch.randperm(n_in)
    act = ActSpec(4, g, 0.9)
    ref = quantize_tokens(x[:, perm], act, k)
    got = quantize_tokens_triton(x.cuda(), act, k, perm.cuda())
    for a, b in ((ref.codes, got.codes), (ref.scale, got.scale), (ref.outlier, got.outlier), (ref.outlier_scale, got.outlier_scale)):
        assert torch.equal(a, b.cpu())


@pytest.mark.parametrize("name", list(SHAPES))
def test_w4a4_gemm_on_gpu_within_rescale_bound(name):
    from lowbit.kernels.triton.w4a4 import prepare, run

    t, out, n_in, k, g = SHAPES[name]
    torch.manual_seed(2)
    x = torch.randn(t, n_in) * 2
    p = from_float(torch.randn(out, n_in) / n_in ** 0.5, "w4a4", group=g, n_outliers=k, act_clip=0.9, bias=torch.randn(out))
    y = run(x.cuda(), prepare(p, "cuda")).cpu()
    y64, mag = reference.integer_reference(x, p)
    ng = p.scale.shape[1]
    # exact int32 group products; float32 rescale and accumulation: (ng + 3) roundings of 2^-24
    assert torch.isfinite(y).all()
    assert torch.all((y.double() - y64).abs() <= (ng + 3) * 2.0 ** -24 * mag + 1e-12)


def test_dispatch_picks_triton_for_cuda_w4a4():
    from lowbit.kernels import prepare

    p = from_float(torch.randn(64, 256), "w4a4", group=128, n_outliers=16, act_clip=0.9)
    pl = prepare(p, "cuda")
    assert pl.kernel == "triton"
    x = torch.randn(3, 256)
    torch.testing.assert_close(pl(x.cuda()).cpu(), prepare(p, "cpu", "reference")(x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_block_hadamard_on_gpu_same_bits_as_cpu(dtype):
    """The rotated presets' online transform compiled for the GPU: the CPU torch path's bits."""
    from lowbit.kernels.cpu.hadamard import block_hadamard_reference
    from lowbit.nn.online_hadamard import BlockHadamard

    torch.manual_seed(3)
    for t, n, normal, block in ((1, 576, 512, 128), (37, 1536, 1472, 64), (512, 4096, 3968, 128)):
        x = (torch.randn(t, n) * torch.exp(torch.randn(n))).to(dtype)
        got = BlockHadamard(n, normal, block)(x.cuda()).cpu()
        bits = torch.int32 if dtype == torch.float32 else torch.int16
        assert torch.equal(got.view(bits), block_hadamard_reference(x, normal, block).view(bits))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_input_hadamard_on_gpu_same_bits_as_cpu(dtype):
    """R4's online transform (orders p·m) compiled for the GPU: the CPU torch path's bits."""
    from lowbit.kernels.cpu.hadamard import input_hadamard_reference
    from lowbit.nn.online_hadamard import InputHadamard

    torch.manual_seed(4)
    for t, n in ((1, 1536), (37, 576), (512, 14336), (3, 4096)):
        x = (torch.randn(t, n) * torch.exp(torch.randn(n))).to(dtype)
        got = InputHadamard(n)(x.cuda()).cpu()
        bits = torch.int32 if dtype == torch.float32 else torch.int16
        assert torch.equal(got.view(bits), input_hadamard_reference(x).view(bits))
