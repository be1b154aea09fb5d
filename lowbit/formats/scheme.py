"""Quantization schemes as data: small frozen dataclasses that round-trip through JSON.

A scheme says *what* to do (bits, groups, outliers, KV cache, GPTQ, smoothing); the code in
this package says *how*. Keeping it data means a checkpoint records exactly the recipe that
made it, and a preset is just a named value (like compressed-tensors' QuantizationArgs or
torchao's configs).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from lowbit.errors import LowbitError
from lowbit.formats.absmax import SCALE_RULES

FORMATS = ("int", "fp4")
OUTLIER_PRECISIONS = ("int8", "fp16")
OUTLIER_METRICS = ("sqsum",)
ROTATION_KINDS = ("none", "hadamard", "random-hadamard")


class SchemeError(LowbitError, ValueError):
    """A scheme (or its JSON) is invalid; the message names the field."""


def is_int(x) -> bool:
    """An integer read from JSON or given by a user: ``int`` but not ``bool`` (which Python counts as
    one). The schemes, the compressed-tensors reader and the vLLM plugin's planning check with it."""
    return isinstance(x, int) and not isinstance(x, bool)


def _check_bits(where: str, bits: int, allowed: tuple[int, ...]) -> None:
    if not is_int(bits) or bits not in allowed:
        raise SchemeError(f"{where}.bits must be one of {allowed}, got {bits!r}")


def _check_group(where: str, g: int) -> None:
    if not is_int(g) or g < 0:
        raise SchemeError(f"{where}.group_size must be an integer >= 0 (0 = whole row), got {g!r}")


def _check_clip(where: str, c: float) -> None:
    if not isinstance(c, (int, float)) or not 0.0 < float(c) <= 1.0:
        raise SchemeError(f"{where}.clip_ratio must be in (0, 1], got {c!r}")


def _check_numbers(where: str, bits: int, group: int, clip: float, fmt: str) -> None:
    """The fields weights and activations share: bits, group size, clip ratio, number format."""
    _check_bits(where, bits, (2, 3, 4, 5, 6, 8, 16))
    _check_group(where, group)
    _check_clip(where, clip)
    if fmt not in FORMATS:
        raise SchemeError(f"{where}.format must be one of {FORMATS}, got {fmt!r}")
    if fmt == "fp4" and bits != 4:
        raise SchemeError(f"{where}.format 'fp4' needs bits=4")


class _Bits:
    """``enabled``: 16 bits means "leave float"."""

    bits: int

    @property
    def enabled(self) -> bool:
        return self.bits < 16


@dataclass(frozen=True)
class WeightArgs(_Bits):
    """Weights: ``bits`` 16 means "leave float". group_size 0 = one scale per output row."""

    bits: int = 16
    group_size: int = 128
    symmetric: bool = True
    clip_ratio: float = 1.0
    clip_search: bool = False  # per row and group, try ratios down to 0.75 and keep the best MSE
    format: str = "int"
    clip_min: float = 0.75  # the search tries clip_steps ratios evenly from 1 down to clip_min
    clip_steps: int = 6
    clip_weighted: bool = False  # weight each column's squared error by its input energy (diag XᵀX)

    def __post_init__(self):
        _check_numbers("weights", self.bits, self.group_size, self.clip_ratio, self.format)
        _check_clip("weights.clip_min", self.clip_min)
        if not is_int(self.clip_steps) or self.clip_steps < 1:
            raise SchemeError(f"weights.clip_steps must be an integer >= 1, got {self.clip_steps!r}")
        if not isinstance(self.clip_weighted, bool):
            raise SchemeError(f"weights.clip_weighted must be true or false, got {self.clip_weighted!r}")

    @property
    def clip_ratios(self) -> tuple[float, ...]:
        """The ratios (times ``clip_ratio``) the clipping search tries, largest first."""
        if self.clip_steps == 1:
            return (1.0,)
        step = (1.0 - self.clip_min) / (self.clip_steps - 1)
        return tuple(round(1.0 - i * step, 6) for i in range(self.clip_steps))


@dataclass(frozen=True)
class ActArgs(_Bits):
    """Activations, quantized dynamically per token (scales from each token's own values)."""

    bits: int = 16
    group_size: int = 128
    symmetric: bool = True
    clip_ratio: float = 1.0
    format: str = "int"
    dynamic: bool = True
    # "signed": the signed absmax on code -2^(b-1) (lowbit's grid); "compressed-tensors": absmax /
    # ((2^b - 1) / 2), what that format's readers compute (lowbit.formats.absmax)
    scale_rule: str = "signed"

    def __post_init__(self):
        _check_numbers("activations", self.bits, self.group_size, self.clip_ratio, self.format)
        if not self.dynamic:
            raise SchemeError("activations.dynamic=False (static scales) is not implemented; use dynamic per-token")
        if self.scale_rule not in SCALE_RULES:
            raise SchemeError(f"activations.scale_rule must be one of {SCALE_RULES}, got {self.scale_rule!r}")
        if self.scale_rule != "signed" and self.enabled and (self.format != "int" or not self.symmetric):
            raise SchemeError(f"activations.scale_rule={self.scale_rule!r} is a rule for symmetric INT activations, "
                              f"not format={self.format!r} symmetric={self.symmetric}")


@dataclass(frozen=True)
class OutlierArgs:
    """The ``count`` input channels with the largest activation square-sum stay in higher precision."""

    count: int = 0
    precision: str = "int8"
    metric: str = "sqsum"
    max_fraction: float = 0.125  # never more than this share of an input's channels (narrow models)

    def k_for(self, n_in: int) -> int:
        return min(self.count, int(n_in * self.max_fraction))

    def __post_init__(self):
        if not isinstance(self.max_fraction, (int, float)) or not 0.0 < float(self.max_fraction) <= 1.0:
            raise SchemeError(f"outliers.max_fraction must be in (0, 1], got {self.max_fraction!r}")
        if not is_int(self.count) or self.count < 0:
            raise SchemeError(f"outliers.count must be an integer >= 0, got {self.count!r}")
        if self.precision not in OUTLIER_PRECISIONS:
            raise SchemeError(f"outliers.precision must be one of {OUTLIER_PRECISIONS}, got {self.precision!r}")
        if self.metric not in OUTLIER_METRICS:
            raise SchemeError(f"outliers.metric must be one of {OUTLIER_METRICS}, got {self.metric!r}")


@dataclass(frozen=True)
class KVArgs(_Bits):
    """KV cache: one scale (and zero point) per token per head; any head_dim. ``hadamard``
    (QuaRot's R3): store each head's keys (after RoPE) and values rotated by the orthonormal
    Hadamard of order head_dim, so a few large channels no longer set every token's scale.
    ``group_size``: one scale per this many values of a head instead (it must divide head_dim;
    0 = the whole head): wide heads (Gemma 3's 256) lose much less with groups of 64."""

    bits: int = 16
    symmetric: bool = False
    hadamard: bool = False
    group_size: int = 0  # absent in checkpoints saved before it existed: from_dict gives 0

    def __post_init__(self):
        _check_bits("kv_cache", self.bits, (2, 3, 4, 8, 16))
        g = self.group_size
        if not is_int(g) or g < 0 or g == 1:
            raise SchemeError(f"kv_cache.group_size must be 0 (the whole head) or an integer >= 2, got {g!r}")
        if not isinstance(self.hadamard, bool):
            raise SchemeError(f"kv_cache.hadamard must be true or false, got {self.hadamard!r}")
        if self.hadamard and not self.enabled:
            raise SchemeError("kv_cache.hadamard rotates the quantized KV cache: it needs kv_cache.bits < 16")


@dataclass(frozen=True)
class GPTQArgs:
    """GPTQ. ``true_sequential``: inside a layer, quantize q/k/v, then o_proj, then gate/up, then
    down_proj, each from inputs that already pass through the quantized linears before it (one
    extra partial forward per step). ``float_target``: aim at the float model's outputs rather
    than the float layer's outputs on quantized inputs (see :mod:`lowbit.quantize.float_target`;
    one extra float forward per layer; dense models only)."""

    enabled: bool = False
    damp: float = 0.01
    block_size: int = 128
    act_order: bool = False
    true_sequential: bool = False
    float_target: bool = False

    def __post_init__(self):
        if not isinstance(self.damp, (int, float)) or not 0.0 <= float(self.damp) < 1.0:
            raise SchemeError(f"gptq.damp must be in [0, 1), got {self.damp!r}")
        if not is_int(self.block_size) or self.block_size <= 0:
            raise SchemeError(f"gptq.block_size must be a positive integer, got {self.block_size!r}")
        for flag in ("act_order", "true_sequential", "float_target"):
            if not isinstance(getattr(self, flag), bool):
                raise SchemeError(f"gptq.{flag} must be true or false, got {getattr(self, flag)!r}")


@dataclass(frozen=True)
class SmoothArgs:
    """SmoothQuant: move activation range into weights by ``s = max|X|^a / max|W|^(1-a)``."""

    enabled: bool = False
    alpha: float = 0.5

    def __post_init__(self):
        if not isinstance(self.alpha, (int, float)) or not 0.0 <= float(self.alpha) <= 1.0:
            raise SchemeError(f"smooth.alpha must be in [0, 1], got {self.alpha!r}")


@dataclass(frozen=True)
class TPArgs:
    """Quantize for ``world`` tensor-parallel ranks: the row-parallel linears (o_proj, down_proj)
    get a block-diagonal outlier permutation, with groups, outliers and GPTQ local to each rank's
    input slice, so every rank can quantize its activations without the others' channels."""

    world: int = 1

    def __post_init__(self):
        if not is_int(self.world) or self.world < 1:
            raise SchemeError(f"tensor_parallel.world must be an integer >= 1, got {self.world!r}")


@dataclass(frozen=True)
class RotationArgs:
    """Rotate the float model before calibration (:mod:`lowbit.quantize.rotation`): ``hadamard``
    (orthonormal Hadamard) or ``random-hadamard`` (seeded random ±1 diagonal times it) on the
    residual stream (R1), per head on v/o (``r2``) and online at the down_proj input (``r4``).
    Exact in real arithmetic; R1 and R2 change only plain weights, R4 adds an online transform.
    ``block`` (independent of ``kind``) rotates inside INT4 blocks after the outlier permutation."""

    kind: str = "none"
    seed: int = 0
    r2: bool = True  # per-head rotation of v_proj's outputs and o_proj's inputs (offline)
    r4: bool = False  # online Hadamard at every down_proj input (its weight holds W·H)
    # online Hadamard inside blocks of each linear's normal channels, after the outlier
    # permutation (lowbit.quantize.block_rotation): the largest power of two <= block dividing them; 0 off
    block: int = 0

    def __post_init__(self):
        if self.kind not in ROTATION_KINDS:
            raise SchemeError(f"rotation.kind must be one of {ROTATION_KINDS}, got {self.kind!r}")
        if not is_int(self.seed) or self.seed < 0:
            raise SchemeError(f"rotation.seed must be an integer >= 0, got {self.seed!r}")
        b = self.block
        if not is_int(b) or b < 0 or (b and b & (b - 1)) or b == 1:
            raise SchemeError(f"rotation.block must be 0 (off) or a power of two >= 2, got {b!r}")
        for name in ("r2", "r4"):
            if not isinstance(getattr(self, name), bool):
                raise SchemeError(f"rotation.{name} must be true or false, got {getattr(self, name)!r}")

    @property
    def enabled(self) -> bool:
        return self.kind != "none"

    @property
    def online(self) -> bool:
        """An online transform is installed (R4 or the block Hadamard)."""
        return (self.enabled and self.r4) or self.block > 0


_PARTS = {
    "weights": WeightArgs,
    "activations": ActArgs,
    "outliers": OutlierArgs,
    "kv_cache": KVArgs,
    "gptq": GPTQArgs,
    "smooth": SmoothArgs,
    "tensor_parallel": TPArgs,
    "lm_head": WeightArgs,
    "rotation": RotationArgs,
}


@dataclass(frozen=True)
class Scheme:
    name: str = "custom"
    weights: WeightArgs = field(default_factory=WeightArgs)
    activations: ActArgs = field(default_factory=ActArgs)
    outliers: OutlierArgs = field(default_factory=OutlierArgs)
    kv_cache: KVArgs = field(default_factory=KVArgs)
    gptq: GPTQArgs = field(default_factory=GPTQArgs)
    smooth: SmoothArgs = field(default_factory=SmoothArgs)
    tensor_parallel: TPArgs = field(default_factory=TPArgs)
    # the output projection (bits 16: left float): GPTQ on its calibration inputs where gptq runs, else RTN
    # (lowbit.quantize.head)
    lm_head: WeightArgs = field(default_factory=WeightArgs)
    # absent in checkpoints saved before rotation existed: from_dict gives the default (none)
    rotation: RotationArgs = field(default_factory=RotationArgs)

    def __post_init__(self):
        if self.outliers.count and not self.weights.enabled and not self.activations.enabled:
            raise SchemeError("outliers need quantized weights or activations")
        if self.gptq.enabled and not self.weights.enabled:
            raise SchemeError("gptq needs quantized weights (weights.bits < 16)")
        if self.gptq.act_order and self.outliers.count:
            raise SchemeError("gptq.act_order and outlier reordering both fix the column order; pick one")
        rot = self.rotation
        if rot.online and not (self.weights.enabled or self.activations.enabled):
            raise SchemeError("rotation.r4 and rotation.block are online transforms inside quantized linears: they "
                              "need quantized weights or activations")
        if rot.online and self.tensor_parallel.world > 1:
            raise SchemeError("rotation.r4 and rotation.block rotate inputs that tensor parallelism splits across "
                              "ranks; use rotation.r4=false and rotation.block=0 with --tp")
        if rot.r4 and rot.enabled and rot.block:
            raise SchemeError("rotation.r4 and rotation.block each put an online transform in down_proj; pick one")

    def with_(self, **parts: Any) -> "Scheme":
        """A copy with some parts replaced, e.g. ``s.with_(kv_cache=KVArgs(bits=4))``."""
        return replace(self, **parts)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Scheme":
        if not isinstance(d, dict):
            raise SchemeError(f"a scheme must be a JSON object, got {type(d).__name__}")
        unknown = set(d) - {"name", *_PARTS}
        if unknown:
            raise SchemeError(f"unknown scheme field(s): {sorted(unknown)}")
        kw: dict[str, Any] = {"name": str(d.get("name", "custom"))}
        for key, typ in _PARTS.items():
            part = d.get(key, {})
            if not isinstance(part, dict):
                raise SchemeError(f"{key} must be an object, got {part!r}")
            names = {f.name for f in fields(typ)}
            bad = set(part) - names
            if bad:
                raise SchemeError(f"unknown field(s) in {key}: {sorted(bad)}; known: {sorted(names)}")
            kw[key] = typ(**part)
        return cls(**kw)
