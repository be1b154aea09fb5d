"""The default model (SmolLM2-135M, hidden 576 = 16·36, head_dim 64, intermediate 1536 = 128·12,
tied head) rotated in fp32 keeps its WikiText-2 perplexity within 1e-5 relative (3 windows of 128
tokens; the randomized Hadamard with R1 + R2 + the online R4: the case that uses every part. The
plain Hadamard and R1 + R2 alone are the same code with fewer parts; they were checked once on
this model (README, Rotation) and run on the tiny architectures in tests/quantize/test_rotation.py)."""

import pytest

from lowbit.checkpoint import load_model
from lowbit.eval.perplexity import perplexity
from lowbit.formats.scheme import RotationArgs
from lowbit.nn.online_hadamard import HadamardInputLinear
from lowbit.quantize.rotation import rotate_model

pytestmark = pytest.mark.model
WINDOWS, SEQLEN = 3, 128


@pytest.fixture(scope="module")
def reference():
    model, tok = load_model("default")
    return tok, perplexity(model, tok, "wikitext2", seqlen=SEQLEN, max_windows=WINDOWS, progress=False)


@pytest.mark.parametrize("kind,r4", [("random-hadamard", True)])
def test_rotated_default_model_keeps_its_perplexity(reference, kind, r4):
    tok, ref = reference
    model, _ = load_model("default")
    assert model.lm_head.weight is model.model.embed_tokens.weight
    rotate_model(model, RotationArgs(kind=kind, seed=1, r4=r4))
    assert isinstance(model.model.layers[0].mlp.down_proj, HadamardInputLinear) == r4
    assert model.lm_head.weight is not model.model.embed_tokens.weight
    got = perplexity(model, tok, "wikitext2", seqlen=SEQLEN, max_windows=WINDOWS, progress=False)
    assert got.n_tokens == ref.n_tokens
    assert abs(got.ppl - ref.ppl) <= 1e-5 * ref.ppl, (ref.ppl, got.ppl)
    print(f"{kind} r4={r4}: ppl {ref.ppl:.6f} -> {got.ppl:.6f} ({abs(got.ppl - ref.ppl) / ref.ppl:.1e} relative)")
