"""What folding the norm scale does to a rotated input: for each RMSNorm of the default model
(2 x 256 calibration tokens), the channel with the most normalized-input energy, its share of
that energy, its share after the norm scale, and its scale over the scale's RMS. A small last
column means the norm damps that channel, and folding the scale into the weights (R1) leaves it
undamped in the rotated activation.

    PYTHONPATH=. python scripts/rotation/norm_scales.py
"""

import torch

from lowbit.checkpoint import load_model
from lowbit.data import calibration_ids


def main() -> None:
    torch.set_num_threads(1)
    model, tok = load_model("default")
    store, hooks = {}, []
    for i, layer in enumerate(model.model.layers):
        for name in ("input_layernorm", "post_attention_layernorm"):
            def hook(m, a, o, key=(i, name)):
                x = a[0].float().reshape(-1, a[0].shape[-1])
                store[key] = (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + m.variance_epsilon), m.weight.float())
            hooks.append(getattr(layer, name).register_forward_hook(hook))
    with torch.no_grad():
        model(calibration_ids(tok, 2, 256))
    print("layer norm            top-channel share of |x̂|²   of |x̂·w|²   w[top]/rms(w)")
    for (i, name), (xh, w) in sorted(store.items()):
        e, ew = xh.pow(2).mean(0), (xh * w).pow(2).mean(0)
        top = int(e.argmax())
        print(f"{i:5d} {name:26s} {e[top] / e.sum():10.3f} {ew[top] / ew.sum():12.3f} {w[top] / w.pow(2).mean().sqrt():12.3f}")


if __name__ == "__main__":
    main()
