#!/usr/bin/env bash
# The main job on the embedded default: the real model (SmolLM2-135M-Instruct) and real data.
#  1. every number format measured on the model's weights and real activations;
#  2. the model quantized with the Atom recipe + INT4 KV cache, a Hadamard inside each INT4 block
#     and in each KV head (w4a4-kv4-rot), compared with float.
#     A 2-core CPU gets 16 x 512 calibration tokens (Atom uses 128 x 2048) and 5 evaluation windows.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/venv.sh
mkdir -p out
.venv/bin/lowbit formats --model default --json out/formats.json --plot out/formats.png
.venv/bin/lowbit quantize default --scheme w4a4-kv4-rot --samples 16 --seqlen 512 \
    --eval-windows 5 --eval-seqlen 512 --json out/quantize.jsonl "$@"
