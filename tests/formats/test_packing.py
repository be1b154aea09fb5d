"""Bit packing: exact round trips, exact sizes, out-of-range codes rejected."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from lowbit.formats import pack, packed_size, planes, unpack


@given(st.integers(1, 8), st.lists(st.integers(0, 5), min_size=0, max_size=2), st.integers(0, 300), st.integers(0, 2**31 - 1))
def test_round_trip_exact(bits, lead, n, seed):
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 2**bits, (*lead, n), generator=g, dtype=torch.uint8)
    packed = pack(codes, bits)
    assert packed.dtype == torch.uint8
    assert packed.shape == (*lead, packed_size(n, bits))
    assert torch.equal(unpack(packed, bits, n), codes)


@pytest.mark.parametrize("bits,expected", [(8, 2048), (6, 1536), (4, 1024), (3, 768), (2, 512)])
def test_sizes_of_a_2048_row(bits, expected):
    assert packed_size(2048, bits) == expected
    assert pack(torch.zeros(2048, dtype=torch.uint8), bits).numel() == expected


def test_plane_layout():
    assert planes(6) == [4, 2] and planes(3) == [2, 1] and planes(4) == [4] and planes(8) == [8]
    # 4 bits: first code in the low nibble
    assert pack(torch.tensor([0x3, 0xA], dtype=torch.uint8), 4).tolist() == [0xA3]
    # 6 bits: a 4-bit plane of the low bits, then a 2-bit plane of the high bits
    codes = torch.tensor([0b110101, 0b011010, 0b000001, 0b111111], dtype=torch.uint8)
    packed = pack(codes, 6)
    assert packed[:2].tolist() == [0b1010_0101, 0b1111_0001]
    assert packed[2].item() == 0b11_00_01_11


def test_signed_codes_accepted_when_in_range():
    codes = torch.tensor([0, 1, 7], dtype=torch.int32)
    assert torch.equal(unpack(pack(codes, 3), 3, 3), codes.to(torch.uint8))


@pytest.mark.parametrize("bits,bad", [(4, 16), (3, 8), (2, -1), (6, 64)])
def test_out_of_range_codes_rejected(bits, bad):
    codes = torch.tensor([0, bad], dtype=torch.int16)
    with pytest.raises(ValueError, match="out of range"):
        pack(codes, bits)


def test_float_codes_rejected():
    with pytest.raises(TypeError, match="integer"):
        pack(torch.tensor([1.0]), 4)


def test_unpack_wrong_size_rejected():
    with pytest.raises(ValueError, match="bytes per row"):
        unpack(torch.zeros(10, dtype=torch.uint8), 4, 32)
    with pytest.raises(TypeError, match="uint8"):
        unpack(torch.zeros(16, dtype=torch.int8), 4, 32)


@pytest.mark.parametrize("bits", [0, 9])
def test_bad_bits_rejected(bits):
    with pytest.raises(ValueError, match="bits"):
        pack(torch.zeros(8, dtype=torch.uint8), bits)
