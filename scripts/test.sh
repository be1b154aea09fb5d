#!/usr/bin/env bash
# The whole test suite, in the same environment as the main job.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/venv.sh
exec .venv/bin/python -m pytest -n 2 --dist loadfile "$@"
