"""The two-shot rounds' driver and entry points (the collectives themselves: test_allreduce.py,
test_channels.py)."""

import pytest
import torch

from lowbit.comm.codecs import get_codec
from lowbit.comm.twoshot import pipelined, run_rounds, two_shot_channels


def test_a_depth_below_one_is_refused_before_any_round():
    c = get_codec("int4")
    with pytest.raises(ValueError, match="depth must be >= 1"):
        pipelined(torch.zeros(10), 4, c, None, [{}], 0)
    with pytest.raises(ValueError, match="depth must be >= 1"):
        two_shot_channels(torch.zeros(2, 576), c, None, depth=0)


@pytest.mark.parametrize("depth", [1, 2, 3, 5])
def test_rounds_advance_oldest_first_with_at_most_depth_in_flight(depth):
    """Every round runs its stages in order, rounds start in order, and no more than ``depth`` are
    ever started and unfinished at once (their buffers are reused ``depth`` rounds later)."""
    log, live, peak = [], set(), [0]

    def start(i):
        def go():
            live.add(i)
            peak[0] = max(peak[0], len(live))
            log.append(("start", i))
            return i
        return go

    def stage(name):
        def run(i):
            log.append((name, i))
            if name == "finish":
                live.discard(i)
        return run

    run_rounds([start(i) for i in range(7)], (stage("reduce"), stage("finish")), depth)
    for i in range(7):
        steps = [s for s, j in log if j == i]
        assert steps == ["start", "reduce", "finish"]
    assert [j for s, j in log if s == "start"] == list(range(7))
    assert peak[0] <= depth
