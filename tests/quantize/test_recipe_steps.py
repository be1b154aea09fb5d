"""The steps a scheme runs, decided once: permute_only keeps only the reordering; a KV-only
scheme touches no linear; the presets' flags follow their scheme fields."""

from lowbit.formats.scheme import GPTQArgs, SmoothArgs
from lowbit.quantize import get_scheme
from lowbit.quantize.recipe_steps import RecipeSteps


def test_permute_only_keeps_only_the_reordering():
    s = get_scheme("w4a4-kv4").with_(smooth=SmoothArgs(enabled=True), gptq=GPTQArgs(enabled=True, float_target=True,
                                                                                     true_sequential=True))
    st = RecipeSteps.of(s, permute_only=True)
    assert st.replace_linears and st.needs_linear_stats
    assert not (st.float_target or st.smooth or st.quantize_weights or st.true_sequential or st.kv_cache or st.lm_head)
    assert st.activations is None
    full = RecipeSteps.of(s, permute_only=False)
    assert full.float_target and full.smooth and full.quantize_weights and full.true_sequential and full.kv_cache
    assert full.activations is s.activations


def test_kv_only_scheme_needs_no_statistics():
    st = RecipeSteps.of(get_scheme("kv4"), permute_only=False)
    assert st.kv_cache and not st.replace_linears and not st.needs_linear_stats
    assert not RecipeSteps.of(get_scheme("w4a16"), False).activations.enabled
    assert RecipeSteps.of(get_scheme("w4a16"), False).replace_linears
