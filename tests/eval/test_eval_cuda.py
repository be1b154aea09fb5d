"""The evaluators on a GPU give the CPU's numbers (fp32, TF32 off: same math up to reduction order)."""

import math

import torch

from lowbit.eval.loglik import Request, score_requests
from lowbit.eval.perplexity import window_nll
from tests.cuda import needs_cuda
from tests.tiny_models import tiny_llama

pytestmark = needs_cuda


def test_window_nll_and_loglik_on_cuda_equal_cpu():
    torch.backends.cuda.matmul.allow_tf32 = False
    model = tiny_llama(vocab_size=512)
    ids = torch.randint(0, 512, (2, 96))
    cpu = window_nll(model, ids)
    gpu = window_nll(model.to("cuda"), ids)
    assert gpu.device.type == "cpu"
    torch.testing.assert_close(gpu, cpu, rtol=1e-4, atol=1e-4)
    reqs = [Request([1, 2, 3, 4], [5, 6]), Request([7] * 40, [8])]
    a = score_requests(model, reqs, batch_size=2, progress=False)
    model.to("cpu")
    b = score_requests(model, reqs, batch_size=2, progress=False)
    for u, v in zip(a, b):
        assert math.isclose(u.logprob, v.logprob, rel_tol=1e-4, abs_tol=1e-4) and u.n_tokens == v.n_tokens
