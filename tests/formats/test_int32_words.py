"""lowbit's int32 words against compressed-tensors' own pack_to_int32 / unpack_from_int32."""

import pytest
import torch

pytest.importorskip("compressed_tensors", reason="needs the export extra (compressed-tensors==0.17.0)")

from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32, unpack_from_int32  # noqa: E402

from lowbit.formats.int32_words import pack_int32, unpack_int32  # noqa: E402


@pytest.mark.parametrize("bits", range(1, 9))
@pytest.mark.parametrize("dim", [0, 1])
def test_same_words_as_compressed_tensors(bits, dim):
    g = torch.Generator().manual_seed(bits)
    codes = torch.randint(0, 2 ** bits, (37, 45), generator=g, dtype=torch.uint8)  # widths that leave padding
    signed = (codes.to(torch.int16) - 2 ** (bits - 1)).to(torch.int8)
    words = pack_int32(codes, bits, dim)
    assert torch.equal(words, pack_to_int32(signed, bits, packed_dim=dim))
    assert torch.equal(unpack_from_int32(words, bits, codes.shape, packed_dim=dim), signed)
    assert torch.equal(unpack_int32(words, bits, codes.shape[dim], dim), codes)
