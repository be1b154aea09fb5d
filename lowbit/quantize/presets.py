"""Named schemes. ``w4a4`` is the Atom recipe: INT4 weights and activations in groups of 128,
the top-k activation channels kept in INT8 at the end of each input, clipping, GPTQ.

The outlier count (64 of 576 hidden channels, 11%; capped at 1/8 of any input's width) was
chosen on the default model by the measurement in the README ("choice of k": with RTN and
clipping, k=64 gives 1.31x float perplexity against 1.41x for k=32); Atom keeps 128 of 4096.
"""

from __future__ import annotations

from .scheme import ActArgs, GPTQArgs, KVArgs, OutlierArgs, Scheme, SchemeError, SmoothArgs, WeightArgs

OUTLIERS = 64

_W4A4 = Scheme(
    name="w4a4",
    weights=WeightArgs(bits=4, group_size=128, symmetric=True, clip_search=True),
    activations=ActArgs(bits=4, group_size=128, symmetric=True, clip_ratio=0.9),
    outliers=OutlierArgs(count=OUTLIERS, precision="int8"),
    gptq=GPTQArgs(enabled=True, damp=0.01, block_size=128),
)

PRESETS: dict[str, Scheme] = {
    "w8a8": Scheme(
        name="w8a8",
        weights=WeightArgs(bits=8, group_size=0, symmetric=True),
        activations=ActArgs(bits=8, group_size=0, symmetric=True),
        smooth=SmoothArgs(enabled=True, alpha=0.5),
    ),
    "w4a16": Scheme(
        name="w4a16",
        weights=WeightArgs(bits=4, group_size=128, symmetric=True),
        gptq=GPTQArgs(enabled=True, damp=0.01, block_size=128, act_order=True),
    ),
    "w4a4-rtn": Scheme(
        name="w4a4-rtn",
        weights=WeightArgs(bits=4, group_size=128, symmetric=True),
        activations=ActArgs(bits=4, group_size=128, symmetric=True),
    ),
    "w4a4": _W4A4,
    "w4a4-kv4": _W4A4.with_(name="w4a4-kv4", kv_cache=KVArgs(bits=4, symmetric=False)),
    "w3a3": _W4A4.with_(
        name="w3a3",
        weights=WeightArgs(bits=3, group_size=128, symmetric=True, clip_search=True),
        activations=ActArgs(bits=3, group_size=128, symmetric=True, clip_ratio=0.9),
    ),
    "w4a4-fp4": _W4A4.with_(
        name="w4a4-fp4",
        weights=WeightArgs(bits=4, group_size=32, format="fp4", clip_search=True),
        activations=ActArgs(bits=4, group_size=32, format="fp4"),
    ),
    "kv4": Scheme(name="kv4", kv_cache=KVArgs(bits=4, symmetric=False)),
}


def get_scheme(name: str) -> Scheme:
    try:
        return PRESETS[name]
    except KeyError:
        raise SchemeError(f"unknown scheme {name!r}; presets: {', '.join(PRESETS)}") from None
