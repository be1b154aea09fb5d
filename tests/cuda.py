"""Marker for tests that need a CUDA device: they are skipped on CPU-only machines (CI) and run
by ``scripts/gpu_check.sh`` wherever a GPU is lent."""

import pytest
import torch

needs_cuda = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
