"""What ``lowbit bench serve`` can serve: a format is a checkpoint maker and vLLM's arguments.

A maker turns the float model into folders on disk: the one ``vllm serve`` loads and, where lowbit
runs the same weights itself, the one ``load_model`` opens for lowbit's own loop. Formats for
other vLLM integrations (``--quantization ...``) are added with :func:`register_format`.
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


def _exported(fmt: str) -> Callable[[Source, Path], Checkpoints]:
    def make(src: Source, out: Path) -> Checkpoints:
        from lowbit.checkpoint import save_quantized

        from .vllm_exports import export_for_vllm, quantize_for_vllm

        model = quantize_for_vllm(src.model, fmt, src.calib_ids)
        save_quantized(model, out / "lowbit", src.tokenizer)
        export_for_vllm(model, src.tokenizer, out / "compressed-tensors")
        return Checkpoints(vllm=out / "compressed-tensors", lowbit=out / "lowbit")

    return make


FORMATS: dict[str, ServeFormat] = {}


def register_format(fmt: ServeFormat) -> ServeFormat:
    """Add (or replace) a format ``--formats`` can name."""
    FORMATS[fmt.name] = fmt
    return fmt


register_format(ServeFormat("bf16", _float, about="the float model, served in bf16"))
register_format(ServeFormat("w8a8", _exported("w8a8"),
                            about="lowbit W8A8 (SmoothQuant, RTN) exported to compressed-tensors int-quantized"))
register_format(ServeFormat("w4a16", _exported("w4a16"),
                            about="lowbit W4A16 g64 (RTN) exported to compressed-tensors pack-quantized"))
