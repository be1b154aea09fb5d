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
    with pytest.raises(TPSplitError, match="cannot split experts of 2 channels over 3 ranks"):
        make_plan(tiny_config("qwen3_moe", moe_intermediate_size=2), 3)


def test_a_kv_head_on_several_ranks_is_counted_by_one():
    """OLMo 2's k norm sums squares over KV heads: replicated or expanded copies count once."""
    from lowbit.models.shard_plan import owned_kv

    plan = make_plan(tiny_config("olmo2"), 3)  # 4 heads on 2 KV heads: KV 1 on ranks 1 and 2
    assert [a.kv_heads for a in plan.attn] == [(0,), (1,), (1,)]
    assert [owned_kv(plan, r) for r in range(3)] == [[True], [True], [False]]
    plan = make_plan(tiny_config("olmo2", num_attention_heads=8, hidden_size=64), 3)  # rank 1: KV 0, 1, 1 expanded
    assert plan.attn[1].kv_heads == (0, 1, 1)
    assert [owned_kv(plan, r) for r in range(3)] == [[True], [False, True, False], [False]]


def test_every_expert_is_split_like_a_dense_mlp():
    """Qwen3-MoE: each rank keeps the same rows of every expert's gate|up and columns of its down;
    its dense layers (mlp_only_layers) are split by their own width."""
    from lowbit.models.shard_plan import column_rows, row_columns, row_parallel_splits

    cfg = tiny_config("qwen3_moe")  # 4 experts of 64 rows, dense MLP of 128
    plan = make_plan(cfg, 3)
    rows = column_rows(plan, 1, moe=True)
    assert rows["mlp.experts.experts.3.gate_up_proj"] == [(22, 43), (86, 107)]
    assert "mlp.gate_proj" not in rows and column_rows(plan, 1)["mlp.gate_proj"] == [(43, 86)]
    assert row_columns(plan, 2, moe=True)["mlp.experts.experts.0.down_proj"] == (43, 64)
    splits = row_parallel_splits(cfg, 3)
    assert splits["mlp.down_proj"] == [43, 43, 42]
    assert all(splits[f"mlp.experts.experts.{e}.down_proj"] == [22, 21, 21] for e in range(4))
