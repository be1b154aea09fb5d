from lowbit.bench.serve_steps import parse_iterations, split

# as vLLM 0.32's /metrics exposes it (prometheus_client text format), other series around it
METRICS = """# HELP vllm:iteration_tokens_total Histogram of number of tokens per engine_step.
# TYPE vllm:iteration_tokens_total histogram
vllm:iteration_tokens_total_bucket{engine="0",le="1.0",model_name="m"} 3.0
vllm:iteration_tokens_total_bucket{engine="0",le="+Inf",model_name="m"} 12.0
vllm:iteration_tokens_total_count{engine="0",model_name="m"} 12.0
vllm:iteration_tokens_total_sum{engine="0",model_name="m"} 150.0
vllm:iteration_tokens_total_count{engine="1",model_name="m"} 8.0
vllm:iteration_tokens_total_sum{engine="1",model_name="m"} 10.0
vllm:generation_tokens_total{engine="0",model_name="m"} 99.0
"""


def test_steps_and_tokens_are_summed_over_engines():
    assert parse_iterations(METRICS) == (20.0, 160.0)
    assert parse_iterations("") == (0.0, 0.0)


def test_split_of_a_level():
    ops0 = {"pid": 7, "seconds": 1.0}
    ops1 = {"pid": 7, "seconds": 1.5}
    got = split((10.0, 100.0), (20.0, 300.0), ops0, ops1, wall_s=2.0)
    assert got["steps"] == 10 and got["tokens_per_step"] == 20.0 and got["step_ms"] == 200.0
    assert abs(got["linear_ms"] - 50.0) < 1e-9 and abs(got["rest_ms"] - 150.0) < 1e-9 and got["linear_share"] == 0.25


def test_split_by_token_ranges_is_the_level_s_part():
    ops0 = {"pid": 7, "seconds": 1.0, "by_tokens": {"1": [0.5, 100, 100], "9-32": [0.5, 10, 200]}}
    ops1 = {"pid": 7, "seconds": 1.7, "by_tokens": {"1": [0.6, 150, 150], "9-32": [0.5, 10, 200],
                                                    "129-512": [0.6, 3, 900]}}
    got = split((10.0, 100.0), (20.0, 300.0), ops0, ops1, wall_s=2.0)["linear_by_tokens"]
    assert set(got) == {"1", "129-512"}  # no call of 9-32 tokens in this level
    assert got["1"]["calls"] == 50 and got["1"]["tokens"] == 50 and abs(got["1"]["us_per_call"] - 2000.0) < 1e-6
    assert got["129-512"] == {"calls": 3, "tokens": 900, "us_per_call": 200000.0}


def test_split_without_the_op_or_the_counter_says_unknown():
    no_ops = split((0.0, 0.0), (5.0, 5.0), None, None, wall_s=1.0)
    assert no_ops["step_ms"] == 200.0 and no_ops["linear_ms"] is None and no_ops["rest_ms"] is None
    assert split(None, (5.0, 5.0), None, None, 1.0)["steps"] is None
    assert split((5.0, 5.0), (5.0, 5.0), None, None, 1.0)["step_ms"] is None  # no step ran
    restarted = split((0.0, 0.0), (5.0, 5.0), {"pid": 1, "seconds": 9.0}, {"pid": 2, "seconds": 1.0}, 1.0)
    assert restarted["linear_ms"] is None  # another engine process: totals not comparable
