"""Which steps of the recipe run, decided once from the scheme and ``permute_only``.

``permute_only`` (a check, not a format) keeps only the outlier reordering: float weights, no
smoothing, no GPTQ, no activation or KV quantization, so the model computes the same function.
Every other step reads its flag here instead of combining the scheme with ``permute_only``.
"""

from __future__ import annotations

from dataclasses import dataclass

from lowbit.formats.scheme import ActArgs, Scheme


@dataclass(frozen=True)
class RecipeSteps:
    float_target: bool  # move float weights to W* before GPTQ (lowbit.quantize.float_target)
    smooth: bool  # fold SmoothQuant scales into a norm and its consumers
    quantize_weights: bool  # GPTQ or RTN into packed weights
    activations: ActArgs | None  # activation quantization of the new linears (None: float inputs)
    replace_linears: bool  # build QuantLinears at all (not for a KV-cache-only scheme)
    true_sequential: bool  # statistics stage by stage inside a layer
    kv_cache: bool
    lm_head: bool

    @classmethod
    def of(cls, scheme: Scheme, permute_only: bool) -> RecipeSteps:
        if permute_only:
            return cls(float_target=False, smooth=False, quantize_weights=False, activations=None,
                       replace_linears=True, true_sequential=False, kv_cache=False, lm_head=False)
        gptq = scheme.gptq
        return cls(float_target=gptq.enabled and gptq.float_target, smooth=scheme.smooth.enabled,
                   quantize_weights=scheme.weights.enabled, activations=scheme.activations,
                   replace_linears=scheme.weights.enabled or scheme.activations.enabled,
                   true_sequential=gptq.enabled and gptq.true_sequential,
                   kv_cache=scheme.kv_cache.enabled, lm_head=scheme.lm_head.enabled)

    @property
    def needs_linear_stats(self) -> bool:
        """Calibration statistics are needed (anything but a KV-cache/head-only scheme)."""
        return self.replace_linears
