"""The rotation pre-pass: turn a float model into an equal one whose hidden channels are rotated.

A few huge residual channels cost W4A4 most of its accuracy; an orthonormal Hadamard ``Q`` mixes
every channel into every other, so the quantizers see flat inputs (QuaRot). The model computes
the same function (in real arithmetic), and calibration, outlier selection and GPTQ then run on
the rotated weights as usual. Done here, in float64, then cast back to each weight's dtype:

* every RMSNorm scale is folded into the linears it feeds (Llama's ``w``, Gemma's ``1 + w``) and
  the norm set to scale 1 — an unscaled RMSNorm commutes with any rotation;
* R1, the residual stream ``h → h Q1``: embeddings ``E Q1``, readers (q/k/v, gate/up, a MoE
  router, the LM head) ``W Q1``, writers (o_proj, down_proj) ``Q1ᵀ W`` and their bias ``b Q1``;
  a tied LM head is untied (it gets the norm's scale, the embedding does not) and the config
  says ``tie_word_embeddings: false`` so a saved checkpoint reloads it as its own weight;
* R2 (``r2``), per head: v_proj's rows of each KV head ``Q2ᵀ W``, o_proj's columns of each head
  ``W Q2``;
* R4 (``r4``), online: every down_proj (each expert's too) becomes a
  :class:`~lowbit.nn.online_hadamard.HadamardInputLinear` computing ``(x H/√n)(W Q4)ᵀ`` with
  ``Q4 = diag(s) H/√n``; the random signs ``s`` of ``random-hadamard`` are folded into the
  up_proj rows (``act(g) ⊙ (u ⊙ s) = x ⊙ s``), so the online part is always the plain Hadamard.

Without R4 a rotated model is plain weights of the original shape.
"""

from __future__ import annotations

import torch
from torch import nn

from lowbit.errors import LowbitError
from lowbit.formats.hadamard import factor, fast_transform, random_signs
from lowbit.formats.scheme import RotationArgs
from lowbit.models.adapters import get_adapter
from lowbit.models.module_paths import get_path, set_path
from lowbit.nn.kv_cache import head_dim
from lowbit.nn.online_hadamard import HadamardInputLinear
from lowbit.nn.quant_linear import QuantLinear


class RotationError(LowbitError, ValueError):
    """The model cannot be rotated as asked (already quantized, not loaded, odd shapes)."""


class Rotation:
    """``x → x Q`` on the last dimension, ``Q = diag(signs) · H / √n`` of ``args.kind``, in float64
    by the fast transform (``salt`` varies the random signs between R1 and R2)."""

    def __init__(self, n: int, args: RotationArgs, salt: int = 0):
        factor(n)  # a size with no Hadamard matrix fails here, before the model changes
        self.n = n
        self.signs = random_signs(n, args.seed * 1000003 + salt).double() if args.kind == "random-hadamard" else None

    def right(self, x: torch.Tensor) -> torch.Tensor:
        """``x Q`` (x float64)."""
        return fast_transform(x if self.signs is None else x * self.signs)

    def left_t(self, x: torch.Tensor) -> torch.Tensor:
        """``Qᵀ x`` = ``(xᵀ Q)ᵀ``."""
        return self.right(x.T).T

    def matrix(self) -> torch.Tensor:
        return self.right(torch.eye(self.n, dtype=torch.float64))


def _set(t: torch.Tensor, value: torch.Tensor) -> None:
    with torch.no_grad():
        t.copy_(value.to(t.dtype))


def _check(model: nn.Module) -> None:
    if any(isinstance(m, QuantLinear) for m in model.modules()):
        raise RotationError("rotation is a pre-pass on a float model; this one already has quantized linears")
    for name, p in model.named_parameters():
        if p.is_meta:
            raise RotationError(f"rotation needs every weight in memory ({name} is not loaded); "
                                "load the model whole instead of layer by layer from disk")
        if not p.is_floating_point():
            raise RotationError(f"rotation needs float weights, {name} is {p.dtype}")
        if not torch.isfinite(p).all():
            raise RotationError(f"{name} holds NaN or Inf; refusing to rotate it")


def _fold_norm(norm: nn.Module, readers: list[torch.Tensor], offset: float, q: Rotation) -> None:
    """Readers ``W ← W · diag(offset + w) · Q``; the norm's scale becomes 1."""
    scale = norm.weight.detach().double() + offset
    for w in readers:
        _set(w, q.right(w.detach().double() * scale[None, :]))
    _set(norm.weight, torch.full_like(scale, 1.0 - offset))


def _rotate_writer(lin: nn.Linear, q: Rotation) -> None:
    _set(lin.weight, q.left_t(lin.weight.detach().double()))
    if lin.bias is not None:
        _set(lin.bias, q.right(lin.bias.detach().double()))


def _untie_head(model: nn.Module) -> nn.Linear:
    head = model.get_output_embeddings()
    if not isinstance(head, nn.Linear):
        raise RotationError(f"rotation needs an nn.Linear LM head, got {type(head).__name__}")
    if head.weight is model.get_input_embeddings().weight or getattr(model.config, "tie_word_embeddings", False):
        head.weight = nn.Parameter(head.weight.detach().clone(), requires_grad=head.weight.requires_grad)
        model.config.tie_word_embeddings = False
        text = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        text.tie_word_embeddings = False
    return head


def _rotate_heads(attn: nn.Module, rot: Rotation) -> None:
    """R2: each KV head's value output ``v → v Q2`` and o_proj's matching input columns."""
    d, q2 = rot.n, rot.matrix()
    v, o = attn.v_proj, attn.o_proj
    if v.out_features % d or o.in_features % d:
        raise RotationError(f"head_dim {d} does not divide v_proj ({v.out_features}) or o_proj ({o.in_features})")
    wv = v.weight.detach().double().reshape(-1, d, v.in_features)
    _set(v.weight, torch.einsum("dk,hdi->hki", q2, wv).reshape(v.weight.shape))
    if v.bias is not None:
        _set(v.bias, (v.bias.detach().double().reshape(-1, d) @ q2).reshape(-1))
    wo = o.weight.detach().double().reshape(o.out_features, -1, d)
    _set(o.weight, (wo @ q2).reshape(o.weight.shape))


def _mlp_pairs(layer: nn.Module, adapter) -> list[tuple[nn.Linear, slice, str]]:
    """Each MLP's (linear holding the up rows, which rows, down_proj path) in one decoder layer."""
    arch = adapter.arch
    if arch.experts is None:
        up = get_path(layer, arch.mlp_in[-1])
        return [(up, slice(0, up.out_features), arch.mlp_out)]
    experts = get_path(layer, arch.experts.experts)
    pairs = []
    for i, ex in enumerate(experts):
        gate_up = getattr(ex, arch.experts.gate_up)
        pairs.append((gate_up, slice(gate_up.out_features // 2, gate_up.out_features),
                      f"{arch.experts.experts}.{i}.{arch.experts.down}"))
    return pairs


def _down_rotations(layers, adapter, args: RotationArgs) -> dict[int, Rotation]:
    """R4's rotation for each down_proj width (checked before any weight changes)."""
    out: dict[int, Rotation] = {}
    for layer in layers:
        for _, _, path in _mlp_pairs(layer, adapter):
            down = get_path(layer, path)
            if type(down) is not nn.Linear:
                raise RotationError(f"R4 needs a float nn.Linear at {path}, got {type(down).__name__}")
            if down.in_features not in out:
                out[down.in_features] = Rotation(down.in_features, args, salt=2)
    return out


def _rotate_down_online(layer: nn.Module, adapter, q4s: dict[int, Rotation]) -> None:
    """R4: ``W_down ← W_down Q4``, the up rows times the signs, down_proj rotating its input online."""
    for up, rows, path in _mlp_pairs(layer, adapter):
        down = get_path(layer, path)
        q4 = q4s[down.in_features]
        if q4.signs is not None:
            _set(up.weight[rows], up.weight[rows].detach().double() * q4.signs[:, None])
            if up.bias is not None:
                _set(up.bias[rows], up.bias[rows].detach().double() * q4.signs)
        _set(down.weight, q4.right(down.weight.detach().double()))
        set_path(layer, path, HadamardInputLinear(down))


def rotate_model(model: nn.Module, args: RotationArgs) -> None:
    """Rotate ``model`` in place (nothing for ``kind`` none); it computes the same function."""
    if not args.enabled:
        return
    adapter = get_adapter(model)
    if adapter.arch.rotation_missing:  # the architecture's description says why (lowbit.models.architectures)
        raise RotationError(f"rotation does not support model_type={adapter.model_type!r}: {adapter.arch.rotation_missing}")
    _check(model)
    hidden = model.config.hidden_size
    q1 = Rotation(hidden, args)
    q2 = Rotation(head_dim(model.config), args, salt=1) if args.r2 else None
    adapter.prepare(model)
    q4s = _down_rotations(adapter.layers(model), adapter, args) if args.r4 else {}
    head = _untie_head(model)
    emb = model.get_input_embeddings()
    if emb.weight.shape[-1] != hidden or head.in_features != hidden:
        raise RotationError(f"embedding {tuple(emb.weight.shape)} / LM head {tuple(head.weight.shape)} "
                            f"do not match hidden_size {hidden}")
    _set(emb.weight, q1.right(emb.weight.detach().double()))
    for layer in adapter.layers(model):
        for g in adapter.groups(layer):
            if g.norm is not None:
                readers = [get_path(layer, p).weight for p in g.linears] + [get_path(layer, p) for p in g.extra]
                _fold_norm(get_path(layer, g.norm), readers, adapter.norm_offset, q1)
            else:
                for p in g.linears:
                    _rotate_writer(get_path(layer, p), q1)
        if args.r2:
            _rotate_heads(layer.self_attn, q2)
        if args.r4:
            _rotate_down_online(layer, adapter, q4s)
    _fold_norm(get_path(model, adapter.arch.final_norm), [head.weight], adapter.norm_offset, q1)
