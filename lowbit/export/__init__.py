"""Export lowbit checkpoints to formats other servers read (compressed-tensors, for vLLM and
transformers). One file per job: the scheme mapping as data, one packer per tensor format, the
folder writer."""

from .errors import ExportError
from .writer import export_compressed_tensors

__all__ = ["ExportError", "export_compressed_tensors"]
