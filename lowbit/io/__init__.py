"""Files: atomic writes, output-path checks, safetensors headers read lazily, content hashes and
the atomic folder swap. No model or quantization code lives here."""
