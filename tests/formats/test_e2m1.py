"""The one E2M1 table: derived constants equal the literals the codecs held, and the encoder and
decoder equal the formulas they replaced, bit for bit (ties to the even code, -0.0 for code 8)."""

import torch

from lowbit.formats.fp4 import (E2M1_MIDPOINTS, E2M1_SIGNED, E2M1_UP_ON_TIE, E2M1_VALUES, e2m1_decode,
                                e2m1_encode)


def test_derived_tables_equal_the_former_literals():
    assert E2M1_MIDPOINTS == (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
    assert E2M1_UP_ON_TIE == (0.75, 1.75, 3.5)
    old = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
    assert torch.equal(torch.tensor(E2M1_SIGNED).view(torch.int32), torch.tensor(old).view(torch.int32))


def _old_encode(v):
    a = v.float().abs()
    mids = torch.tensor(E2M1_MIDPOINTS)
    idx = torch.bucketize(a, mids)
    tie = (idx < 7) & (a == mids[idx.clamp(max=6)]) & (idx % 2 == 1)
    return ((v < 0).to(torch.uint8) << 3) | (idx + tie.long()).to(torch.uint8)


def _old_decode(codes):
    mag = torch.tensor(E2M1_VALUES)[(codes & 7).long()]
    return torch.where((codes & 8) != 0, -mag, mag)


def test_encode_equals_the_old_encoder_on_every_tie():
    mids = torch.tensor(E2M1_MIDPOINTS + E2M1_VALUES)
    v = torch.cat([torch.randn(20000, generator=torch.Generator().manual_seed(1)) * 4, mids, -mids,
                   torch.tensor([7.0, -9.0, 1e30, -0.0])])
    for dt in (torch.float32, torch.float16, torch.bfloat16):
        assert torch.equal(e2m1_encode(v.to(dt)), _old_encode(v.to(dt))), dt
    assert e2m1_encode(torch.tensor([0.75, 1.75, 3.5, 0.25, 1.25, 2.5, 5.0])).tolist() == [2, 4, 6, 0, 2, 4, 6]


def test_decode_equals_the_old_decoder():
    codes = torch.arange(256).to(torch.uint8)
    assert torch.equal(e2m1_decode(codes).view(torch.int32), _old_decode(codes).view(torch.int32))
    assert e2m1_decode(torch.empty(0, 3, dtype=torch.uint8)).shape == (0, 3)
