"""The head/MLP split rule: every head assigned once, KV heads consistent, clear errors."""

import pytest

from lowbit.models.shard_plan import TPSplitError, attention_plan, even_ranges, make_plan
from tests.tiny_models import tiny_config


def test_even_ranges_cover_in_order():
    for n in range(1, 20):
        for w in range(1, n + 1):
            rs = even_ranges(n, w)
            assert rs[0][0] == 0 and rs[-1][1] == n
            assert all(a[1] == b[0] for a, b in zip(rs, rs[1:]))
            sizes = [hi - lo for lo, hi in rs]
            assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1


def test_default_model_splits():
    # SmolLM2: 9 heads, 3 KV heads
    assert [len(s.q_heads) for s in attention_plan(9, 3, 2)] == [6, 3]  # by KV group, no replication
    assert [s.kv_heads for s in attention_plan(9, 3, 3)] == [(0,), (1,), (2,)]
    p4 = attention_plan(9, 3, 4)  # fewer KV heads than ranks: KV replicated
    assert [s.q_heads for s in p4] == [(0, 1, 2), (3, 4), (5, 6), (7, 8)]
    assert [s.kv_heads for s in p4] == [(0,), (1,), (1, 2), (2,)]
    assert [s.groups for s in p4] == [3, 2, 1, 2]


@pytest.mark.parametrize("heads,kv", [(9, 3), (8, 2), (6, 6), (12, 4), (5, 1), (32, 8), (14, 2)])
def test_every_head_once_and_kv_consistent(heads, kv):
    for w in range(1, heads + 1):
        plan = attention_plan(heads, kv, w)
        assert [h for s in plan for h in s.q_heads] == list(range(heads))
        for s in plan:
            s.check(heads // kv)
            assert len(s.q_heads) == s.groups * len(s.kv_heads)


def test_unequal_kv_use_expands_kv():
    p = attention_plan(8, 2, 3)  # rank 1 has heads 3,4,5: one from KV 0, two from KV 1
    assert p[1].q_heads == (3, 4, 5) and p[1].kv_heads == (0, 1, 1) and p[1].groups == 1


def test_impossible_splits_raise():
    with pytest.raises(TPSplitError, match="no head"):
        attention_plan(4, 2, 5)
    with pytest.raises(TPSplitError, match="multiple"):
        attention_plan(9, 2, 2)
    with pytest.raises(TPSplitError, match="ranks must be"):
        attention_plan(4, 2, 0)
    with pytest.raises(TPSplitError, match="MLP"):
        make_plan(tiny_config("llama", intermediate_size=2), 3)
    with pytest.raises(TPSplitError, match="supports"):
        make_plan(tiny_config("mixtral"), 2)
