"""Shared test settings: deterministic torch, a quieter hypothesis profile for 2-core CI."""

import os

import torch
from hypothesis import HealthCheck, settings

torch.manual_seed(0)
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

settings.register_profile(
    "lowbit", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "lowbit"))
