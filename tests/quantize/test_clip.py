"""The weight clipping search: its ratio grid and the input-energy weighting."""

import pytest
import torch

from lowbit.quantize import GPTQArgs, SchemeError, WeightArgs
from lowbit.formats.grid import CLIP_SEARCH, Grid
from lowbit.quantize.weights import gptq


def test_clip_ratio_grid():
    assert WeightArgs().clip_ratios == pytest.approx(CLIP_SEARCH)
    r = WeightArgs(clip_min=0.6, clip_steps=17).clip_ratios
    assert len(r) == 17 and r[0] == 1.0 and r[-1] == pytest.approx(0.6) and list(r) == sorted(r, reverse=True)
    assert WeightArgs(clip_steps=1).clip_ratios == (1.0,)
    for bad in (dict(clip_steps=0), dict(clip_steps=2.5), dict(clip_min=0.0), dict(clip_weighted="yes")):
        with pytest.raises(SchemeError):
            WeightArgs(**bad)


def test_weighted_search_minimises_the_weighted_error():
    g = torch.Generator().manual_seed(0)
    blocks = torch.randn(256, 32, generator=g)
    blocks[:, 0] *= 4  # a large weight per row: clipping it is cheap unless its input is strong
    grid, ratios = Grid(4, True), (1.0, 0.9, 0.8, 0.7, 0.6)
    weights = torch.ones(32)
    weights[0] = 1000.0

    def werr(s, w):
        q = grid.decode(grid.encode(blocks, s, None), s, None)
        return ((q - blocks).pow(2) * w).sum(1)

    s_plain, _ = grid.fit_search(blocks, ratios)
    s_w, _ = grid.fit_search(blocks, ratios, weights)
    assert (werr(s_w, weights) <= werr(s_plain, weights) + 1e-6).all()
    assert (werr(s_plain, torch.ones(32)) <= werr(s_w, torch.ones(32)) + 1e-6).all()
    assert (werr(s_w, weights) < werr(s_plain, weights) - 1e-6).any()  # the weighting changes choices
    for r in ratios:  # and each choice is the best of the grid
        s, _ = grid.fit(blocks, r)
        assert (werr(s_w, weights) <= werr(s, weights) + 1e-6).all()


@pytest.mark.parametrize("act_order", [False, True])
def test_gptq_runs_with_fine_weighted_clipping(act_order):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(400, 64, generator=g) * torch.linspace(0.1, 3, 64)
    w = torch.randn(16, 64, generator=g) * 0.05
    h = x.t() @ x
    plain = gptq(w, h, WeightArgs(bits=4, group_size=16), GPTQArgs(enabled=True, act_order=act_order)).dequantize()
    fine = gptq(w, h, WeightArgs(bits=4, group_size=16, clip_search=True, clip_min=0.6, clip_steps=9, clip_weighted=True),
                GPTQArgs(enabled=True, act_order=act_order)).dequantize()
    err = lambda q: ((q - w) @ x.t()).pow(2).sum()  # noqa: E731
    assert err(fine) < 1.05 * err(plain)  # a search that includes ratio 1 cannot be much worse


def test_act_order_static_groups_match_the_storage_order():
    """With a diagonal Hessian GPTQ has no error to spread, so act order (which visits columns by
    decreasing input energy) must store exactly round-to-nearest codes with the original-order
    group scales: scales fitted in one order and stored in another would break this."""
    from lowbit.formats.quantized_weight import rtn

    g = torch.Generator().manual_seed(2)
    w = torch.randn(8, 96, generator=g)
    h = torch.diag(torch.rand(96, generator=g) + 0.1)
    for args in (WeightArgs(bits=4, group_size=32), WeightArgs(bits=4, group_size=32, clip_search=True)):
        a = gptq(w, h, args, GPTQArgs(enabled=True, act_order=True, damp=0.0))
        b = rtn(w, args)
        assert torch.equal(a.codes, b.codes) and torch.equal(a.scale, b.scale)


def test_rtn_weighted_clipping_uses_each_groups_input_energy():
    """Round-to-nearest with ``clip_weighted`` weights each group's search by its own columns'
    diag XᵀX (before, RTN ignored the flag and searched unweighted: a silent no-op)."""
    from lowbit.formats.quantized_weight import rtn
    from lowbit.quantize import Scheme
    from lowbit.quantize.weights import quantize_weights

    g = torch.Generator().manual_seed(3)
    w = torch.randn(24, 80, generator=g)
    w[:, ::16] *= 5  # one large weight per group of 16: whether to clip it depends on its input
    energy = torch.rand(80, generator=g) + 0.01
    energy[::32] = 1e4  # strong inputs on every second group's large column only
    args = WeightArgs(bits=4, group_size=16, clip_search=True, clip_weighted=True)
    weighted, plain = rtn(w, args, importance=energy), rtn(w, args)
    assert not torch.equal(weighted.scale, plain.scale)
    grid = Grid(4, True)
    for i in range(5):  # each group's scales: the weighted search over that group alone
        s, _ = grid.fit_search(w[:, 16 * i:16 * (i + 1)], args.clip_ratios, energy[16 * i:16 * (i + 1)])
        assert torch.equal(weighted.scale[:, i], s)
    unweighted = WeightArgs(bits=4, group_size=16, clip_search=True)
    assert torch.equal(rtn(w, unweighted, importance=energy).scale, plain.scale)  # the flag decides
    x = torch.randn(200, 80, generator=g) * energy.sqrt()
    scheme = Scheme(weights=args, gptq=GPTQArgs(enabled=False))
    (via,) = quantize_weights([w], [x.t() @ x], scheme, 0, shared_input=False)
    assert torch.equal(via.scale, rtn(w, args, importance=torch.diag(x.t() @ x)).scale)
