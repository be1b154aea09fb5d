"""``bench serve --rounds``: the formats taken in turn within each level, rotating, the median round kept."""

import pytest

from lowbit.bench.serve_rounds import interleaved_points, median_round, rotated
from lowbit.bench.serve_server import ServerFailed


class Server:
    """Answers level(c) with the next of its rates, logging the call order."""

    def __init__(self, name, rates, log, fail_at=None):
        self.name, self.rates, self.log, self.fail_at = name, list(rates), log, fail_at

    def level(self, c):
        self.log.append((self.name, c))
        if c == self.fail_at:
            raise ServerFailed(f"{self.name} died at {c}")
        return {"concurrency": c, "output_tok_s": self.rates.pop(0)}


def test_each_level_takes_the_formats_in_turn_in_a_rotating_order():
    log = []
    servers = {n: Server(n, [1.0] * 6, log) for n in ("a", "b", "c")}
    interleaved_points(servers, [1, 16], 3, lambda n, e: None)
    assert log == [("a", 1), ("b", 1), ("c", 1), ("b", 1), ("c", 1), ("a", 1), ("c", 1), ("a", 1), ("b", 1),
                   ("a", 16), ("b", 16), ("c", 16), ("b", 16), ("c", 16), ("a", 16), ("c", 16), ("a", 16), ("b", 16)]
    assert rotated(["a", "b"], 3) == ["b", "a"] and rotated([], 2) == []


def test_the_median_round_is_kept_with_every_rate():
    got = median_round([{"output_tok_s": 9.0, "x": 1}, {"output_tok_s": 3.0, "x": 2},
                        {"output_tok_s": 5.0, "x": 3, "linear_ms": 7.0, "linear_by_tokens": {"1": {"calls": 4}}}])
    assert got == {"output_tok_s": 5.0, "x": 3, "linear_ms": 7.0, "linear_by_tokens": {"1": {"calls": 4}},
                   "rounds_output_tok_s": [9.0, 3.0, 5.0], "rounds_step_ms": [None, None, None],
                   "rounds_linear_ms": [None, None, 7.0], "rounds_linear_by_tokens": [None, None, {"1": {"calls": 4}}]}
    # an even count: the lower middle, a round that ran (not an average of two)
    assert median_round([{"output_tok_s": 4.0}, {"output_tok_s": 2.0}])["output_tok_s"] == 2.0


def test_a_failing_server_is_reported_once_and_the_others_go_on():
    log, failed = [], []
    servers = {"a": Server("a", [1.0] * 6, log), "b": Server("b", [2.0] * 6, log, fail_at=16)}
    pts = interleaved_points(servers, [1, 16, 64], 2, lambda n, e: failed.append((n, str(e))))
    assert failed == [("b", "b died at 16")]
    assert [p["concurrency"] for p in pts["a"]] == [1, 16, 64]
    assert [p["concurrency"] for p in pts["b"]] == [1]  # its level 16 had no round, level 64 never ran
    assert ("b", 64) not in log and log.count(("b", 16)) == 1


@pytest.mark.parametrize("rounds", [1, 2])
def test_one_round_per_level_is_the_plain_order(rounds):
    log = []
    servers = {n: Server(n, [1.0] * 2, log) for n in ("a", "b")}
    interleaved_points(servers, [4], rounds, lambda n, e: None)
    assert log[:2] == [("a", 4), ("b", 4)]


def test_every_round_is_shown_as_it_comes():
    seen = []
    servers = {n: Server(n, [float(i) for i in range(4)], []) for n in ("a", "b")}
    interleaved_points(servers, [1, 2], 2, lambda n, e: None, lambda n, r, p: seen.append((n, r, p["concurrency"])))
    assert seen == [("a", 0, 1), ("b", 0, 1), ("b", 1, 1), ("a", 1, 1), ("a", 0, 2), ("b", 0, 2), ("b", 1, 2), ("a", 1, 2)]
