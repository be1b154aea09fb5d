"""The README's activation-only error table: for q_proj, gate_proj (norm-fed), o_proj and
down_proj of every layer of the default model, the relative output error that W4A4's activation
quantizer alone causes (float weights, float-model inputs of 2 x 256 calibration tokens; INT4
per-token groups of 128, clip 0.9, the top-64 square-sum channels in INT8), with the Hadamard
placed in different ways:

* ``plain``: no rotation (Atom);
* ``rot``: ``x H`` on the whole input (for q/gate: the scaled norm output; for down_proj: R4);
* ``fold+rot``: R1 as lowbit builds it: the norm scale folded into the weights, ``x̂ H``;
* ``k64+groupH``: outliers first, then a Hadamard in each 128-block (64 for down_proj) of the rest.

    PYTHONPATH=. python scripts/rotation/act_error.py
"""

import math
from collections import defaultdict

import torch

from lowbit.checkpoint import load_model
from lowbit.data import calibration_ids
from lowbit.formats.hadamard import fast_transform
from lowbit.formats.scheme import ActArgs
from lowbit.nn.quantized_activation import quantize_activation
from lowbit.quantize.outliers import outlier_permutation

ACT = ActArgs(bits=4, group_size=128, symmetric=True, clip_ratio=0.9)
K = 64
SITES = (("self_attn.q_proj", "input_layernorm"), ("mlp.gate_proj", "post_attention_layernorm"),
         ("self_attn.o_proj", None), ("mlp.down_proj", None))


def rotate(t):
    return fast_transform(t.double()).float()


def group_rotate(x, n):
    b = 128 if n % 128 == 0 else 64
    head = fast_transform(x[:, :n].reshape(x.shape[0], -1, b)).reshape(x.shape[0], n)
    return torch.cat([head, x[:, n:]], 1)


def act_error(x, w, k, group_h=False):
    """(squared output error, squared output) of quantizing ``x``'s activations, outliers by square-sum."""
    perm = outlier_permutation((x * x).sum(0), k) if k else torch.arange(x.shape[1])
    xp, wp = x[:, perm], w[:, perm]
    if group_h:
        n = x.shape[1] - k
        xp, wp = group_rotate(xp, n), group_rotate(wp, n)
    xa = quantize_activation(xp, ACT, k, "int8").dequantize()
    return ((xa - xp) @ wp.T).pow(2).sum().item(), (xp @ wp.T).pow(2).sum().item()


def main() -> None:
    torch.set_num_threads(1)
    model, tok = load_model("default")
    cap, hooks = {}, []
    for i, layer in enumerate(model.model.layers):
        for lin, norm in SITES:
            hooks.append(layer.get_submodule(lin).register_forward_hook(
                lambda m, a, o, key=(i, lin): cap.__setitem__(key, (a[0].reshape(-1, a[0].shape[-1]).float(),
                                                                    m.weight.detach().float()))))
            if norm:
                hooks.append(layer.get_submodule(norm).register_forward_hook(
                    lambda m, a, o, key=(i, norm): cap.__setitem__(key, (a[0].reshape(-1, a[0].shape[-1]).float(), m))))
    with torch.no_grad():
        model(calibration_ids(tok, 2, 256))
    res = defaultdict(lambda: defaultdict(lambda: [0.0, 0.0]))
    for i in range(len(model.model.layers)):
        for lin, norm in SITES:
            x, w = cap[(i, lin)]
            rows = {"plain k64": act_error(x, w, K), "plain k0": act_error(x, w, 0),
                    "rot k64": act_error(rotate(x), rotate(w), K), "rot k0": act_error(rotate(x), rotate(w), 0),
                    "k64+groupH": act_error(x, w, K, group_h=True)}
            if norm:
                xin, nm = cap[(i, norm)]
                xh = xin * torch.rsqrt(xin.pow(2).mean(-1, keepdim=True) + nm.variance_epsilon)
                wf = w * nm.weight.detach().float()[None, :]
                rows["fold+rot k64"] = act_error(rotate(xh), rotate(wf), K)
                rows["fold+rot k0"] = act_error(rotate(xh), rotate(wf), 0)
            for name, (e, s) in rows.items():
                res[lin][name][0] += e
                res[lin][name][1] += s
    for lin, d in res.items():
        print(lin, "  ".join(f"{v}={math.sqrt(e / s):.4f}" for v, (e, s) in d.items()))


if __name__ == "__main__":
    main()
