"""A block whose largest magnitude occurs as both +a and -a: the reference codec picks the scale
by the same rule as the fast and C codecs (the first of the two, ``formats.absmax``), so their
bytes agree; before, the reference took the positive one and disagreed with them."""

import pytest
import torch

from lowbit.comm.codecs import fast, reference


@pytest.mark.parametrize("codec", ["int4", "int6", "int8", "fp4"])
@pytest.mark.parametrize("first", [-1.0, 1.0])
def test_tied_absmax_same_bytes(codec, first):
    x = torch.randn(2 * 2048, generator=torch.Generator().manual_seed(5)) * 0.1
    x[0], x[5] = first, -first  # block 0: a tie of magnitudes
    x[2048 + 40], x[2048 + 33] = 2.0, -2.0  # another block: the negative one first
    ref = reference.encode_ref(x, codec)
    assert torch.equal(fast.encode_torch(x, codec), ref)
    assert torch.equal(fast.encode(x, codec), ref)
    assert torch.equal(reference.decode_ref(ref, codec, x.numel(), torch.float32),
                       fast.decode(ref, codec, x.numel(), torch.float32))
