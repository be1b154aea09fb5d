"""What ``lowbit bench serve`` can serve: a format is a checkpoint maker and vLLM's arguments.

A maker turns the float model into folders on disk: the one ``vllm serve`` loads and, where lowbit
runs the same weights itself, the one ``load_model`` opens for lowbit's own loop. Three families:
``bf16`` (the float model, vLLM's own BF16 linears), ``w8a8``/``w4a16`` (lowbit's checkpoints
exported to compressed-tensors: vLLM's own INT kernels) and ``plugin-*`` (lowbit's checkpoint
folder itself, ``--quantization lowbit``: lowbit's kernels inside vLLM). ``plugin-w8a8`` and
``plugin-w4a16`` serve the very checkpoints ``w8a8`` and ``w4a16`` export (quantized once per
run), so the two rows differ only in whose kernels run. More with :func:`register_format`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable


@dataclass(frozen=True)
class Source:
    """What a maker gets: the float model (fp32, not to be modified), its tokenizer, calibration ids."""

    model: object
    tokenizer: object
    calib_ids: object
    made: dict = field(default_factory=dict)  # lowbit scheme -> (folder, quantized model): one quantization per run


@dataclass(frozen=True)
class Checkpoints:
    vllm: Path  # the folder ``vllm serve`` loads
    lowbit: Path | None  # the folder lowbit's own loop loads; None: no lowbit row for this format


@dataclass(frozen=True)
class ServeFormat:
    name: str
    make: Callable[[Source, Path], Checkpoints]  # writes into the given (new) folder
    vllm_args: tuple[str, ...] = ()  # extra ``vllm serve`` arguments
    vllm_env: dict[str, str] = field(default_factory=dict)  # extra environment of the server
    about: str = ""


def _float(src: Source, out: Path) -> Checkpoints:
    src.model.save_pretrained(out)  # fp32; vLLM casts to --dtype, lowbit's loop to bf16
    src.tokenizer.save_pretrained(out)
    return Checkpoints(vllm=out, lowbit=out)


def _lowbit(src: Source, scheme: str, out: Path) -> tuple[Path, object]:
    """lowbit's checkpoint of ``scheme`` (a :data:`.vllm_exports.VLLM_SCHEMES` key): written to
    ``out`` the first time a run asks for it, the earlier folder after that."""
    if scheme not in src.made:
        from lowbit.checkpoint import save_quantized

        from .vllm_exports import quantize_for_vllm

        model = quantize_for_vllm(src.model, scheme, src.calib_ids)
        save_quantized(model, out, src.tokenizer)
        src.made[scheme] = (out, model)
    return src.made[scheme]


def _exported(fmt: str) -> Callable[[Source, Path], Checkpoints]:
    def make(src: Source, out: Path) -> Checkpoints:
        from .vllm_exports import export_for_vllm

        folder, model = _lowbit(src, fmt, out / "lowbit")
        export_for_vllm(model, src.tokenizer, out / "compressed-tensors")
        return Checkpoints(vllm=out / "compressed-tensors", lowbit=folder)

    return make


def _plugin(scheme: str) -> Callable[[Source, Path], Checkpoints]:
    def make(src: Source, out: Path) -> Checkpoints:
        folder, _ = _lowbit(src, scheme, out / "lowbit")
        return Checkpoints(vllm=folder, lowbit=folder)

    return make


FORMATS: dict[str, ServeFormat] = {}


def register_format(fmt: ServeFormat) -> ServeFormat:
    """Add (or replace) a format ``--formats`` can name."""
    FORMATS[fmt.name] = fmt
    return fmt


def register_variant(base: str, suffix: str, env: dict[str, str]) -> ServeFormat:
    """``<base>-<suffix>``: format ``base`` (its checkpoint, made once per run, and its vLLM
    arguments) served with ``env`` added to its server's environment, so one run can compare
    settings such as ``LOWBIT_THREADS`` side by side (``scripts/serve_thread_modes.py``)."""
    if base not in FORMATS:
        raise KeyError(f"no serve format {base!r}: choose from {', '.join(FORMATS)}")
    b = FORMATS[base]
    about = f"{b.about}; with {' '.join(f'{k}={v}' for k, v in env.items())}"
    return register_format(ServeFormat(f"{base}-{suffix}", b.make, b.vllm_args, b.vllm_env | env, about))


register_format(ServeFormat("bf16", _float, about="the float model, served in bf16 by vLLM's own linears"))
register_format(ServeFormat("w8a8", _exported("w8a8"),
                            about="lowbit W8A8 (SmoothQuant, RTN) exported to compressed-tensors int-quantized: vLLM's own INT8 kernel"))
register_format(ServeFormat("w4a16", _exported("w4a16"),
                            about="lowbit W4A16 g64 (RTN) exported to compressed-tensors pack-quantized: vLLM's own W4A16 kernel"))
PLUGIN = ("--quantization", "lowbit")
register_format(ServeFormat("plugin-w8a8", _plugin("w8a8"), PLUGIN,
                            about="w8a8's lowbit checkpoint served as it is by lowbit's vLLM plugin (lowbit's kernels)"))
register_format(ServeFormat("plugin-w4a16", _plugin("w4a16"), PLUGIN,
                            about="w4a16's lowbit checkpoint served as it is by lowbit's vLLM plugin (lowbit's kernels)"))
register_format(ServeFormat("plugin-w4a4", _plugin("w4a4"), PLUGIN,
                            about="lowbit W4A4 (Atom: 64 INT8 outlier channels, reorder, g128; RTN) "
                                  "served by lowbit's vLLM plugin; vLLM has no W4A4 kernel of its own"))
for _base in ("w4a16", "w4a4"):
    register_format(ServeFormat(f"plugin-{_base}-head8", _plugin(f"{_base}-head8"), PLUGIN,
                                about=f"plugin-{_base} with the preset's INT8 LM head (per row, lowbit's W8A16 kernel) "
                                      "in place of vLLM's float one"))
register_format(ServeFormat("plugin-w4a4-rot", _plugin("w4a4-rot"), PLUGIN,
                            about="plugin-w4a4 with w4a4-rot's Hadamard inside each INT4 block of every linear's "
                                  "input (applied online, inside lowbit's op)"))
