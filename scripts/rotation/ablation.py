"""One row of the README's rotation ablation: quantize the default model with a preset plus
``--set`` overrides (optionally an experimental variant), print ppl against float on WikiText-2
windows, and with ``--per-linear`` the relative output error of every quantized linear type
(total / activation quantization only / weight quantization only) on 256 test tokens.

    PYTHONPATH=. python scripts/rotation/ablation.py --set rotation.kind=hadamard [--variant group-hadamard]

Same calibration and comparison as ``lowbit quantize default --scheme w4a4 --samples 4
--seqlen 256 --eval-windows 3`` (that command gives the same ppl for the rows without a variant).
"""

import argparse
import copy
import json
import time
from collections import defaultdict

import torch

from lowbit.checkpoint import load_model
from lowbit.data import calibration_ids
from lowbit.data.eval_text import eval_token_ids
from lowbit.eval.float_comparison import compare_to_float, float_reference
from lowbit.models.adapters import get_adapter
from lowbit.models.module_paths import get_path
from lowbit.nn.quantized_activation import quantize_activation
from lowbit.quantize import get_scheme, quantize_model
from lowbit.quantize.overrides import apply_overrides
from lowbit.quantize.rotation import rotate_model


def per_linear_hooks(model, fmodel, report, errs):
    """Hooks comparing each QuantLinear of ``model`` with the float weights of ``fmodel`` on the same input."""
    adapter, hooks = get_adapter(model), []
    for i, (ql, fl) in enumerate(zip(adapter.layers(model), adapter.layers(fmodel))):
        for g in adapter.groups(ql):
            perm = report.permutations.get(f"layers.{i}.{g.linears[0]}")
            for path in g.linears:
                w = get_path(fl, path).weight.detach().float()
                if perm is not None and g.norm is not None:
                    w = w[:, torch.tensor(perm)]

                def hook(mod, args, out, w=w, key=path.split(".")[-1]):
                    x = args[0].reshape(-1, args[0].shape[-1]).float()
                    if getattr(mod, "input_transform", None) is not None:
                        x = mod.input_transform(x)
                    if mod.input_perm is not None:
                        x = x.index_select(1, mod.input_perm)
                    ww = w if mod.input_perm is None else w[:, mod.input_perm]
                    yf = x @ ww.T
                    xa = x if mod.act_args is None else quantize_activation(
                        x, mod.act_args, mod.layout.n_outliers, mod.layout.outlier_precision).dequantize()
                    e = errs[key]
                    e[0] += (out.reshape(yf.shape).float() - yf).pow(2).sum().item()
                    e[1] += (xa @ ww.T - yf).pow(2).sum().item()
                    e[2] += (x @ mod.dequantized_weight().T - yf).pow(2).sum().item()
                    e[3] += yf.pow(2).sum().item()

                hooks.append(get_path(ql, path).register_forward_hook(hook))
    return hooks


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scheme", default="w4a4")
    p.add_argument("--set", dest="overrides", action="append", default=[])
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--seqlen", type=int, default=256)
    p.add_argument("--eval-windows", type=int, default=3)
    p.add_argument("--variant", choices=["norm-output", "group-hadamard"])
    p.add_argument("--per-linear", action="store_true")
    p.add_argument("--reference", help="cache of the float top-k log-probs (made if missing)")
    p.add_argument("--json", help="append the row here")
    a = p.parse_args()
    torch.set_num_threads(1)
    scheme = apply_overrides(get_scheme(a.scheme), a.overrides, None)
    model, tok = load_model("default")
    ids = calibration_ids(tok, a.samples, a.seqlen)
    if a.variant:
        from variants import group_hadamard, norm_output

        norm_output(model) if a.variant == "norm-output" else group_hadamard()
    fmodel = None
    if a.per_linear:
        fmodel = copy.deepcopy(model)
        rotate_model(fmodel, scheme.rotation)
    t0 = time.perf_counter()
    rep = quantize_model(model, scheme, ids, progress=False)
    row = {"scheme": scheme.name, "variant": a.variant, "quantize_s": round(time.perf_counter() - t0, 1)}
    if a.per_linear:
        errs = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
        hooks = per_linear_hooks(model, fmodel, rep, errs)
        with torch.no_grad():
            model(eval_token_ids(tok, "wikitext2")[:256].reshape(1, -1))
        for h in hooks:
            h.remove()
        row["per_linear_total_act_weight"] = {k: [round((v[j] / v[3]) ** 0.5, 4) for j in range(3)]
                                              for k, v in errs.items()}
        del fmodel
    window = dict(seqlen=512, max_windows=a.eval_windows)
    ref = float_reference(a.reference, lambda: load_model("default")[0], tok, progress=False, **window)
    row.update(compare_to_float(ref, model, tok, progress=False, **window))
    print(json.dumps(row))
    if a.json:
        with open(a.json, "a") as f:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
