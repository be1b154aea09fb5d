"""The one signed-absmax scale rule: both tie conventions pinned, and bit-for-bit equal to the
formulas it replaced (weights' choose_qparams, activations' argmax, the codecs' fp16 rounding)."""

import pytest
import torch

from lowbit.formats import choose_qparams, PerToken
from lowbit.formats.absmax import nonzero_scale, signed_absmax, store_scale, symmetric_scale


def _blocks_with_ties(rows=64, L=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    b = torch.randn(rows, L, generator=g)
    b[::2, 3], b[::2, 7] = -4.0, 4.0  # a tie, the negative one first
    b[1::4, 1], b[1::4, 2] = 5.0, -5.0  # a tie, the positive one first
    b[3] = 0.0
    return b


def test_the_two_tie_rules():
    b = torch.tensor([[-3.0, 1.0, 3.0], [3.0, -3.0, 0.0], [0.5, -2.0, 1.0]])
    assert signed_absmax(b, "positive").tolist() == [3.0, 3.0, -2.0]
    assert signed_absmax(b, "first").tolist() == [-3.0, 3.0, -2.0]
    with pytest.raises(ValueError, match="ties"):
        signed_absmax(b, "last")


def test_positive_ties_equal_the_old_weight_formula():
    b = _blocks_with_ties()
    for bits, clip in ((4, 1.0), (8, 0.9), (3, 0.75)):
        hi, lo = b.amax(dim=1), b.amin(dim=1)
        old = torch.where(hi >= -lo, hi, lo) * clip / -(2 ** (bits - 1))
        assert torch.equal(symmetric_scale(b, bits, clip, "positive"), old)


def test_first_ties_equal_the_old_activation_formula():
    b = _blocks_with_ties()
    for bits, clip in ((4, 1.0), (8, 0.85)):
        idx = b.abs().argmax(dim=1, keepdim=True)
        old = b.gather(1, idx).squeeze(1) * clip / -(2 ** (bits - 1))
        assert torch.equal(symmetric_scale(b, bits, clip), old)


def test_choose_qparams_ties_parameter():
    b = torch.tensor([[-4.0, 1.0, 4.0, 0.0]])
    pos = choose_qparams(b, 4, granularity=PerToken()).scale
    first = choose_qparams(b, 4, granularity=PerToken(), ties="first").scale
    assert pos.tolist() == [-0.5] and first.tolist() == [0.5]


SCALES = torch.tensor([1e-3, -1e-3, 0.1, -0.1, 1 / 3, -1 / 3, 1e-8, -1e-8, 0.0, -0.0, 7e4, -7e4,
                       float("inf"), float("-inf"), float("nan"), 65504.0, 2.0 ** -24])


def test_store_scale_never_shrinks_and_equals_the_old_codec_rounding():
    s16 = store_scale(SCALES, torch.float16)
    finite = torch.isfinite(SCALES) & torch.isfinite(s16)
    assert bool((s16.float().abs()[finite] >= SCALES.abs()[finite]).all())
    # the codec's former copy: the cast, stepped away by the sign of the fp16 value
    old = SCALES.to(torch.float16)
    shrunk = old.float().abs() < SCALES.abs()
    old = torch.where(shrunk, torch.nextafter(old, torch.full_like(old, float("inf")).copysign_(old)), old)
    assert torch.equal(s16.view(torch.int16), old.view(torch.int16))
    assert torch.equal(store_scale(SCALES, torch.float32).nan_to_num(0.5), SCALES.nan_to_num(0.5))


def test_storage_rules_differ_on_purpose():
    """Codecs keep NaN/Inf (a poisoned or extended block) and zero (fixed later); the formats
    refuse an overflow and turn a zero scale into 1."""
    from lowbit.formats.affine import _safe_scale

    s = torch.tensor([0.0, 1e5, 0.3])
    assert store_scale(s, torch.float16)[1].isinf()
    with pytest.raises(ValueError, match="overflows"):
        _safe_scale(s, torch.float16)
    assert _safe_scale(s[[0, 2]], torch.float16)[0] == 1.0
    assert nonzero_scale(s)[0] == 1.0 and store_scale(s, torch.float16)[0] == 0.0
