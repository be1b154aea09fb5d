"""Float targets (asymmetric calibration, as in GPTAQ, Li et al. 2025).

Plain GPTQ on layer-by-layer quantized inputs ``X̃`` minimises ``‖(W - Q) X̃‖``: it makes the
quantized layer imitate the float layer *on the already-wrong inputs*, so the error of every
earlier layer passes through untouched. With float targets the goal is the float model's own
output, ``‖W X - Q X̃‖`` (``X``: the float model's inputs of the same tokens). Because

    ‖W X - Q X̃‖² = ‖W X - W* X̃‖² + ‖(W* - Q) X̃‖²,   W* = W (XᵀX̃)(X̃ᵀX̃)⁻¹

(the least-squares residual is orthogonal to the span of ``X̃``), it is exactly GPTQ on ``W*``
with the usual Hessian ``X̃ᵀX̃``: first move the float weights to ``W*``, then quantize.

Few calibration tokens against the input width make the plain solve overfit, so it is a ridge
towards ``W`` itself (not towards zero, which would shrink weakly excited directions):
``W* = (W XᵀX̃ + λW)(X̃ᵀX̃ + λI)⁻¹`` with ``λ = damp × mean diag(X̃ᵀX̃)``, GPTQ's own damping.
"""

from __future__ import annotations

import torch


def float_target_weight(w: torch.Tensor, xtx_q: torch.Tensor, cross: torch.Tensor, damp: float) -> torch.Tensor:
    """``W*`` for ``w [out, in]``; ``xtx_q = X̃ᵀX̃``, ``cross = X̃ᵀX`` (both ``[in, in]``, summed over tokens)."""
    n = w.shape[1]
    if xtx_q.shape != (n, n) or cross.shape != (n, n):
        raise ValueError(f"statistics {tuple(xtx_q.shape)} / {tuple(cross.shape)} do not match weight input dim {n}")
    if not (torch.isfinite(xtx_q).all() and torch.isfinite(cross).all()):
        raise ValueError("float-target statistics contain NaN or Inf")
    h = xtx_q.double().clone()
    diag = torch.diag(h)
    dead = diag == 0
    mean = diag[~dead].mean() if (~dead).any() else torch.tensor(1.0, dtype=h.dtype)
    h[dead, dead] = 1.0
    lam = max(damp, 1e-6) * mean
    h += lam * torch.eye(n, dtype=h.dtype, device=h.device)
    # W*ᵀ = (X̃ᵀX̃ + λI)⁻¹ (X̃ᵀX + λI) Wᵀ
    wt = w.double().t()
    rhs = cross.double() @ wt + lam * wt
    sol = torch.cholesky_solve(rhs, torch.linalg.cholesky(h))
    return sol.t().to(w.dtype)


def aim_at_float_outputs(linears: list, stats: list, damp: float) -> None:
    """Move each linear's float weight to ``W*`` in place (``stats[i]``: its InputStats with
    ``xtx`` and ``cross``), so the GPTQ that follows aims at the float model's outputs."""
    with torch.no_grad():
        for m, st in zip(linears, stats):
            m.weight.copy_(float_target_weight(m.weight.float(), st.xtx, st.cross, damp).to(m.weight.dtype))
