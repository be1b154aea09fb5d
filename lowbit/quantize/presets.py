"""Named schemes. ``w4a4`` is the Atom recipe: INT4 weights and activations in groups of 128,
the top-k activation channels kept in INT8 at the end of each input, clipping, GPTQ.

The outlier count (64 of 576 hidden channels, 11%; capped at 1/8 of any input's width) was
chosen on the default model by the measurement in the README ("choice of k": with RTN and
clipping, k=64 gives 1.31x float perplexity against 1.41x for k=32); Atom keeps 128 of 4096.

``w4a16`` searches the clipping ratio per row and group (static act-order groups): on the default
model (4 x 512 calibration tokens, 5 test windows) that took GPTQ from 1.359x float perplexity
(KL 0.264) to 1.272x (KL 0.240).

``w4a16`` and the W4A4 / W3A3 presets keep the LM head in INT8 per row (:mod:`.head`), half the
bytes of the largest matrix a decode step reads: +0.26 % perplexity on w4a16, +0.20 % on
w4a4-kv4-rot (README). At 32 sequences the bf16 head had cost W4A4 9.2 ms a step against
W4A16's 6.6 with the INT8 one. The head gets GPTQ where the scheme runs it (stop 47): w4a4-rot
1.150x → 1.147x. ``w8a8`` (exported for vLLM's own W8A8) and the plain ``w4a4-rtn``
baseline keep it float.

``w4a4-rot`` is ``w4a4`` plus a Hadamard inside each INT4 block of every linear's normal channels,
after the outlier permutation (``rotation.block=128``; :mod:`.block_rotation`). On the default
model (4 x 256 calibration tokens, 3 test windows) it took w4a4 from 1.329x float perplexity
(KL 0.321) to 1.221x (KL 0.210); a whole-model rotation (R1/R2/R4, QuaRot) made it worse
(1.525-1.561x): README, "Rotation".

``w4a4-kv4`` runs GPTQ true-sequentially (q/k/v, then o_proj on the outputs of the quantized
attention and INT4 KV cache, then gate/up, then down_proj): with 16 x 512 calibration tokens that
took it from 1.519x to 1.487x.

``kv4`` and ``w4a4-kv4`` store each head's keys and values Hadamard-rotated (``kv_cache.hadamard``,
QuaRot's R3): on the default model (5 test windows) that took ``kv4`` from 1.114x float
perplexity to 1.047x and ``w4a4-kv4`` (16 x 512 calibration tokens) from 1.487x to 1.321x.
``w4a4-kv4-rot`` adds ``w4a4-rot``'s block Hadamard: 1.190x, the main job's preset.

``w3a3-rot`` and ``w4a16-rot`` add the same block Hadamard to ``w3a3`` and ``w4a16``; at the main
job's protocol (16 x 512 calibration tokens, 5 test windows; README, "Rotation") they reach
1.756x and 1.109x float perplexity, and ``w4a4-rot`` 1.114x.
"""

from __future__ import annotations

from lowbit.formats.scheme import (ActArgs, GPTQArgs, KVArgs, OutlierArgs, RotationArgs, Scheme, SchemeError, SmoothArgs,
                                   WeightArgs)

OUTLIERS = 64
INT8_HEAD = WeightArgs(bits=8, group_size=0, symmetric=True)

_W4A4 = Scheme(
    name="w4a4",
    weights=WeightArgs(bits=4, group_size=128, symmetric=True, clip_search=True),
    activations=ActArgs(bits=4, group_size=128, symmetric=True, clip_ratio=0.9),
    outliers=OutlierArgs(count=OUTLIERS, precision="int8"),
    gptq=GPTQArgs(enabled=True, damp=0.01, block_size=128),
    lm_head=INT8_HEAD,
)

_KV4 = KVArgs(bits=4, symmetric=False, hadamard=True)
# true-sequential GPTQ: o_proj is calibrated on inputs that went through the INT4 KV cache
_W4A4_KV4 = _W4A4.with_(name="w4a4-kv4", kv_cache=_KV4,
                        gptq=GPTQArgs(enabled=True, damp=0.01, block_size=128, true_sequential=True))

_W3A3 = _W4A4.with_(
    name="w3a3",
    weights=WeightArgs(bits=3, group_size=128, symmetric=True, clip_search=True),
    activations=ActArgs(bits=3, group_size=128, symmetric=True, clip_ratio=0.9),
)
_W4A16 = Scheme(
    name="w4a16",
    weights=WeightArgs(bits=4, group_size=128, symmetric=True, clip_search=True),
    gptq=GPTQArgs(enabled=True, damp=0.01, block_size=128, act_order=True),
    lm_head=INT8_HEAD,
)

PRESETS: dict[str, Scheme] = {
    "w8a8": Scheme(
        name="w8a8",
        weights=WeightArgs(bits=8, group_size=0, symmetric=True),
        activations=ActArgs(bits=8, group_size=0, symmetric=True),
        smooth=SmoothArgs(enabled=True, alpha=0.5),
    ),
    "w4a16": _W4A16,
    "w4a16-rot": _W4A16.with_(name="w4a16-rot", rotation=RotationArgs(block=128)),
    "w4a4-rtn": Scheme(
        name="w4a4-rtn",
        weights=WeightArgs(bits=4, group_size=128, symmetric=True),
        activations=ActArgs(bits=4, group_size=128, symmetric=True),
    ),
    "w4a4": _W4A4,
    "w4a4-rot": _W4A4.with_(name="w4a4-rot", rotation=RotationArgs(block=128)),
    "w4a4-kv4": _W4A4_KV4,
    "w4a4-kv4-rot": _W4A4_KV4.with_(name="w4a4-kv4-rot", rotation=RotationArgs(block=128)),
    "w3a3": _W3A3,
    "w3a3-rot": _W3A3.with_(name="w3a3-rot", rotation=RotationArgs(block=128)),
    "w4a4-fp4": _W4A4.with_(
        name="w4a4-fp4",
        weights=WeightArgs(bits=4, group_size=32, format="fp4", clip_search=True),
        activations=ActArgs(bits=4, group_size=32, format="fp4"),
    ),
    "kv4": Scheme(name="kv4", kv_cache=_KV4),
}


def get_scheme(name: str) -> Scheme:
    try:
        return PRESETS[name]
    except KeyError:
        raise SchemeError(f"unknown scheme {name!r}; presets: {', '.join(PRESETS)}") from None
