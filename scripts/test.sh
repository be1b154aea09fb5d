#!/usr/bin/env bash
# The whole test suite, in the same environment as the main job.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/venv.sh
# vLLM's own environment for tests/export/test_vllm.py and bench serve (~N min once; then a stamp
# check). If it cannot be built, those tests skip and say why; the rest of the suite still runs.
timeout --kill-after=30 1800 bash scripts/venv_vllm.sh || echo "scripts/venv_vllm.sh failed: the vLLM tests will skip" >&2
# Each test has a time limit (pyproject: timeout) and a crashed worker fails its test by name; the
# outer limit ends the run even if pytest itself were stuck, well inside CI's 90 minutes. worksteal,
# not loadfile: xdist's loadfile scheduler waits forever once a crashed worker has been replaced.
exec timeout --kill-after=30 2400 .venv/bin/python -m pytest -n 2 --dist worksteal "$@"
