"""``load_model`` puts a quantized checkpoint on the fast kernels by default and keeps the
reference forward with ``kernel="reference"``; both give the same perplexity within the
kernels' bound, and a model on the kernels is refused by ``save_quantized``."""

import pytest
import torch

from lowbit.accelerate.fuse import FusedPart
from lowbit.accelerate.linears import KernelLinear
from lowbit.checkpoint import load_model, save_quantized
from lowbit.errors import UsageError
from lowbit.eval.perplexity import window_nll
from lowbit.kernels.linear_params import KernelError
from lowbit.nn.quant_linear import QuantLinear
from tests.checkpoint.checkpoints import save_tiny

WINDOWS = torch.randint(0, 128, (4, 64), generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module", params=["w4a4", "w4a16"])
def saved(request, tmp_path_factory):
    return save_tiny(tmp_path_factory, request.param, f"kernels-{request.param}")[0]


def _kinds(model) -> set[type]:
    return {type(m) for m in model.modules() if isinstance(m, (QuantLinear, KernelLinear, FusedPart))}


def _ppl(model) -> float:
    with torch.inference_mode():
        return float(window_nll(model, WINDOWS).mean().exp())


def test_kernels_by_default_reference_on_request(saved, monkeypatch):
    monkeypatch.delenv("LOWBIT_KERNEL", raising=False)
    fast, _ = load_model(str(saved))
    ref, _ = load_model(str(saved), kernel="reference")
    assert QuantLinear not in _kinds(fast) and _kinds(fast) & {KernelLinear, FusedPart}
    assert not fast.lowbit_kernels.get("kept_reference") and all(":cpu" in k for k in fast.lowbit_kernels if ":" in k)
    assert _kinds(ref) == {QuantLinear} and not hasattr(ref, "lowbit_kernels")
    # tests/accelerate/test_linears.py bounds one linear by 1e-4 of its output scale (W4A4: the
    # same integer codes, float32 sums in another order) or 2e-2 (W4A16: the native kernel's bf16
    # activations); the logits get the same bounds, and perplexity (a mean over 252 tokens) agrees
    # to 1e-4 (measured here: W4A4 equal, W4A16 2e-6).
    tol = 1e-4 if fast.lowbit_scheme.activations.enabled else 2e-2
    with torch.inference_mode():
        y, y_ref = fast(WINDOWS).logits, ref(WINDOWS).logits
    assert torch.allclose(y, y_ref, rtol=0, atol=tol * float(y_ref.abs().max()))
    assert _ppl(fast) == pytest.approx(_ppl(ref), rel=1e-4)

def test_the_environment_and_the_argument_choose(saved, monkeypatch):
    monkeypatch.setenv("LOWBIT_KERNEL", "reference")
    assert _kinds(load_model(str(saved))[0]) == {QuantLinear}
    assert QuantLinear not in _kinds(load_model(str(saved), kernel="cpu")[0])
    with pytest.raises(KernelError, match="unknown kernel"):
        load_model(str(saved), kernel="fastest")


def test_a_model_on_the_kernels_is_not_saved_the_reference_one_is(saved, tmp_path):
    fast, _ = load_model(str(saved))
    with pytest.raises(UsageError, match="kernel='reference'"):
        save_quantized(fast, tmp_path / "again")
    assert not (tmp_path / "again").exists()
    ref, _ = load_model(str(saved), kernel="reference")
    save_quantized(ref, tmp_path / "again")
    assert _ppl(load_model(str(tmp_path / "again"), kernel="reference")[0]) == _ppl(ref)
