#!/usr/bin/env bash
# Set up a virtual environment with the server and serve on the embedded SQLite
# database (./rollplan.db). Extra arguments go to `rollplan serve`.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[server]'
exec .venv/bin/rollplan serve "$@"
