import torch

from tests.tiny_models import tiny_model
from lowbit.nn import UnfusedExperts


def test_unfused_experts_compute_the_same_as_mixtral():
    model = tiny_model("mixtral")
    moe = model.model.layers[0].mlp
    x = torch.randn(2, 7, model.config.hidden_size)
    with torch.no_grad():
        want = moe(x)
        moe.experts = UnfusedExperts.from_fused(moe.experts)
        got = moe(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
