"""GPTQ weight quantization of one linear layer, in groups, with the last ``k`` input columns
(the reordered outlier channels) kept in INT8 or FP16; round-to-nearest is
:func:`lowbit.formats.quantized_weight.rtn`.

GPTQ (Frantar et al.) quantizes one column at a time and spreads each column's rounding error
over the columns not yet quantized, weighted by the inverse Hessian ``H = XᵀX`` of the layer's
inputs. Groups get their scales when the sweep reaches their first column, from the already
error-corrected values, with an optional per-row clipping search.
"""

from __future__ import annotations

import torch

from lowbit.formats.grid import n_groups
from lowbit.formats.quantized_weight import INT8, QuantizedWeight, fit_grid, rtn, split_rows, weight_grid
from lowbit.formats.scheme import GPTQArgs, Scheme, WeightArgs


def _prepare_hessian(h: torch.Tensor, w: torch.Tensor, damp: float) -> torch.Tensor:
    h = h.clone().double()
    dead = torch.diag(h) == 0
    h[dead, dead] = 1.0
    w[:, dead] = 0.0
    mean_diag = torch.diag(h).mean()
    h += damp * mean_diag * torch.eye(h.shape[0], dtype=h.dtype, device=h.device)
    try:
        l = torch.linalg.cholesky(h)
    except RuntimeError:  # not positive definite: damp harder once
        h += 0.1 * mean_diag * torch.eye(h.shape[0], dtype=h.dtype, device=h.device)
        l = torch.linalg.cholesky(h)
    hinv = torch.cholesky_inverse(l)
    return torch.linalg.cholesky(hinv, upper=True).float()


def gptq(w: torch.Tensor, h: torch.Tensor, args: WeightArgs, gargs: GPTQArgs, n_outliers: int = 0,
         outlier_precision: str = "int8") -> QuantizedWeight:
    """GPTQ with groups of ``args.group_size``; ``h`` is ``XᵀX`` of the inputs (same column order as ``w``)."""
    w = w.float().clone()
    out, n_in = w.shape
    if h.shape != (n_in, n_in):
        raise ValueError(f"Hessian shape {tuple(h.shape)} does not match weight input dim {n_in}")
    n = n_in - n_outliers
    grid, g = weight_grid(args), args.group_size or max(n, 1)
    ng = n_groups(n, g)
    order = None
    if gargs.act_order:
        if n_outliers:
            raise ValueError("act_order cannot be combined with outlier columns")
        order = torch.argsort(torch.diag(h), descending=True)
        # static groups: scales from the original weights, before any error feedback
        d = torch.diag(h).float()
        static = [fit_grid(grid, w[:, i * g:(i + 1) * g], args, d[i * g:(i + 1) * g]) for i in range(ng)]
        w, h = w[:, order], h[order][:, order]
    hdiag = torch.diag(h).float()
    u = _prepare_hessian(h, w, gargs.damp)
    codes = torch.zeros(out, n, dtype=torch.uint8, device=w.device)
    scale = torch.zeros(out, ng, device=w.device)
    zero = torch.zeros(out, ng, dtype=torch.int32, device=w.device) if not args.symmetric and args.format == "int" else None
    ocodes = []
    cur = (None, None)
    o_scale = None
    bs = gargs.block_size
    for i1 in range(0, n_in, bs):
        i2 = min(i1 + bs, n_in)
        w1 = w[:, i1:i2].clone()
        err1 = torch.zeros_like(w1)
        u1 = u[i1:i2, i1:i2]
        for i in range(i2 - i1):
            col = i1 + i
            x = w1[:, i]
            if col < n:
                orig = int(order[col]) if order is not None else col
                gi = orig // g
                if order is not None:
                    cur = static[gi]
                elif col % g == 0:
                    span = torch.cat([w1[:, i:], w[:, i2:]], dim=1)[:, : min(g, n - col)]
                    cur = fit_grid(grid, span, args, hdiag[col:col + span.shape[1]])
                s, z = cur
                c, q = grid.qdq_fast(x[:, None], s, z)
                q = q[:, 0]
                codes[:, orig] = c[:, 0]
                scale[:, gi] = s
                if zero is not None:
                    zero[:, gi] = z
            else:
                if col == n and outlier_precision == "int8":
                    span = torch.cat([w1[:, i:], w[:, i2:]], dim=1)
                    o_scale, _ = INT8.fit(span)
                if outlier_precision == "int8":
                    c, q = INT8.qdq_fast(x[:, None], o_scale, None)
                    q = q[:, 0]
                    ocodes.append(INT8.signed(c[:, 0]))
                else:
                    q = x.half().float()
                    ocodes.append(x.half())
            e = (x - q) / u1[i, i]
            w1[:, i:] -= e[:, None] * u1[i, i:][None, :]
            err1[:, i] = e
        w[:, i2:] -= err1 @ u[i1:i2, i2:]
    if ocodes:
        outlier = torch.stack(ocodes, dim=1)
    else:
        outlier = w.new_zeros(out, 0, dtype=torch.int8 if outlier_precision == "int8" else torch.float16)
        o_scale = w.new_zeros(out) if outlier_precision == "int8" else None
    if outlier_precision == "fp16":
        o_scale = None
    return QuantizedWeight(codes, scale, zero, outlier, o_scale, grid, args.group_size)


def quantize_weights(weights: list[torch.Tensor], xtx: list[torch.Tensor], scheme: Scheme, k: int,
                     shared_input: bool) -> list[QuantizedWeight]:
    """GPTQ or RTN for each weight; weights that read one input are stacked into one sweep."""
    prec = scheme.outliers.precision
    if not scheme.gptq.enabled:  # the statistics still weight a clipping search (clip_weighted)
        return [rtn(w, scheme.weights, k, prec, torch.diag(h)) for w, h in zip(weights, xtx)]
    if shared_input and len(weights) > 1:
        qw = gptq(torch.cat(weights, dim=0), xtx[0], scheme.weights, scheme.gptq, k, prec)
        return split_rows(qw, [w.shape[0] for w in weights])
    return [gptq(w, h, scheme.weights, scheme.gptq, k, prec) for w, h in zip(weights, xtx)]
