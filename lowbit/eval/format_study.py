"""What each number format costs on a real model: SQNR of its weights and of its linear inputs.

For every format: effective bits per value (codes + scales + zero points, counted over all the
tensors measured) and SQNR in dB, averaged over tensors (mean of per-tensor dB), for

* weights: every decoder linear's weight, "channel" = output row;
* activations: every input site of those linears (captured on calibration text),
  "channel" = token (one scale per token row), groups along the hidden dim.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import torch
from tqdm import tqdm

from lowbit.formats import FP4Format, FP8Format, IntFormat, PerGroup, sqnr_db
from lowbit.formats.spec import Format, row_granularity


@dataclass(frozen=True)
class FormatRow:
    family: str  # "int-sym", "int-asym", "fp4", "fp8"
    label: str
    weight_bits: float
    weight_sqnr_db: float
    act_bits: float
    act_sqnr_db: float


@dataclass(frozen=True)
class OutlierRow:
    site: str
    consumers: list[str]
    ratio: float  # max / median channel square-sum
    top_channel: int


def format_grid() -> list[tuple[str, str, object]]:
    """(family, label, factory(kind) -> Format) for every format in the table."""
    grid = []
    for bits in (8, 6, 4, 3, 2):
        for sym in (True, False):
            fam = "int-sym" if sym else "int-asym"
            for gname, gran in (("channel", None), ("g128", PerGroup(128)), ("g32", PerGroup(32))):
                label = f"INT{bits} {'sym' if sym else 'asym'} {gname}"

                def make(kind, bits=bits, sym=sym, gran=gran):
                    return IntFormat(bits, sym, gran or row_granularity(kind))

                grid.append((fam, label, make))
    for kind in ("fp16", "e8m0", "e4m3"):
        f = FP4Format(kind)
        grid.append(("fp4", f.name, lambda _k, f=f: f))
    for kind in ("e4m3", "e5m2"):
        grid.append(("fp8", f"FP8 {kind.upper()} channel", lambda k, kind=kind: FP8Format(kind, row_granularity(k))))
    return grid


def _measure(fmt_of, tensors: list[torch.Tensor], kind: str) -> tuple[float, float]:
    """(effective bits over all tensors, mean per-tensor SQNR in dB)."""
    fmt: Format = fmt_of(kind)
    bits_total, values, sqnrs = 0.0, 0, []
    for t in tensors:
        bits_total += fmt.effective_bits(tuple(t.shape)) * t.numel()
        values += t.numel()
        sqnrs.append(sqnr_db(t, fmt.fake_quantize(t)))
    return bits_total / values, sum(sqnrs) / len(sqnrs)


def run_study(model, tokenizer, samples: int = 4, seqlen: int = 512, keep_rows: int = 512, progress: bool = True) -> dict:
    """Measure every format of :func:`format_grid` on ``model``'s weights and real activations."""
    from lowbit.data import calibration_ids
    from lowbit.models.capture import capture_inputs, decoder_linears

    t0 = time.time()
    ids = calibration_ids(tokenizer, samples, seqlen)
    sites = capture_inputs(model, ids, keep_rows=keep_rows)
    weights = [m.weight.detach().float() for m in decoder_linears(model).values()]
    acts = [s.sample() for s in sites.values()]
    rows = []
    for fam, label, make in tqdm(format_grid(), desc="formats", disable=not progress):
        wb, ws = _measure(make, weights, "weight")
        ab, as_ = _measure(make, acts, "activation")
        rows.append(FormatRow(fam, label, wb, ws, ab, as_))
    outliers = sorted(
        (OutlierRow(s.name, s.consumers, s.outlier_ratio(), int(s.sq_sum.argmax())) for s in sites.values()),
        key=lambda r: -r.ratio,
    )
    return {
        "model": getattr(model.config, "_name_or_path", ""),
        "calibration": {"samples": samples, "seqlen": seqlen, "tokens": samples * seqlen, "rows_per_site": keep_rows},
        "n_weight_tensors": len(weights),
        "n_input_sites": len(acts),
        "formats": [asdict(r) for r in rows],
        "outliers": [asdict(r) for r in outliers],
        "seconds": time.time() - t0,
    }


def plot_study(result: dict, path: str) -> None:
    """SQNR against effective bits, weights and activations side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    styles = {"int-sym": ("o", "tab:blue"), "int-asym": ("s", "tab:orange"), "fp4": ("^", "tab:green"), "fp8": ("D", "tab:red")}
    fig, axes = plt.subplots(1, 2, figsize=(12, 5), sharey=True)
    for ax, (bits_key, sqnr_key, title) in zip(
        axes, [("weight_bits", "weight_sqnr_db", "weights"), ("act_bits", "act_sqnr_db", "activations (linear inputs)")]
    ):
        for fam, (marker, color) in styles.items():
            pts = [r for r in result["formats"] if r["family"] == fam]
            ax.scatter([p[bits_key] for p in pts], [p[sqnr_key] for p in pts], marker=marker, color=color, label=fam)
        ax.set_title(title)
        ax.set_xlabel("effective bits per value (codes + scales + zero points)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("SQNR (dB, mean over tensors)")
    axes[0].legend()
    fig.suptitle(f"Number formats on {result['model'] or 'the model'}")
    fig.tight_layout()
    from lowbit.io.atomic import atomic_path

    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
