#!/usr/bin/env bash
# The main job on the embedded default: the real model (SmolLM2-135M-Instruct) and real data.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/venv.sh
mkdir -p out
exec .venv/bin/lowbit formats --model default --json out/formats.json --plot out/formats.png "$@"
