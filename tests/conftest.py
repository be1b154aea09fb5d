"""Shared test settings: deterministic torch, a quieter hypothesis profile for 2-core CI."""

import os

import torch
from hypothesis import HealthCheck, settings

torch.manual_seed(0)
# One torch thread per xdist worker when the workers already fill the cores (threads beyond the cores
# make OpenMP's barriers wait on descheduled threads); LOWBIT_TEST_THREADS overrides.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
torch.set_num_threads(int(os.environ.get("LOWBIT_TEST_THREADS", 0))
                      or max(1, min(2, (os.cpu_count() or 1) // max(_WORKERS, 1))))

settings.register_profile(
    "lowbit", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "lowbit"))
