"""The channel reorder: index_select's values (bits) through a faster gather, and clear errors."""

import pytest
import torch

from lowbit.kernels.channel_order import permute_channels


@pytest.mark.parametrize("shape", [(7,), (3, 576), (2, 5, 200), (0, 16), (4, 0, 8)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_equals_index_select(shape, dtype):
    torch.manual_seed(0)
    x = torch.randn(*shape).to(dtype)
    perm = torch.randperm(shape[-1])
    y = permute_channels(x, perm)
    assert y.dtype == dtype and torch.equal(y, x.index_select(-1, perm))
    assert torch.equal(permute_channels(x.transpose(0, -1).contiguous().transpose(0, -1), perm), y)  # strided input


def test_refuses_wrong_permutations():
    x = torch.randn(2, 8)
    with pytest.raises(ValueError, match="permutation"):
        permute_channels(x, torch.arange(7))
    with pytest.raises(ValueError, match="permutation"):
        permute_channels(torch.tensor(1.0), torch.arange(1))
    bad = torch.arange(8)
    bad[2] = 8
    with pytest.raises(RuntimeError, match="out of bounds|index"):
        permute_channels(x, bad)
