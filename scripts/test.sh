#!/usr/bin/env bash
# Set up a virtual environment with the server and test tools, then run the tests.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -k plans -x`.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[dev]'
exec .venv/bin/python -m pytest "$@"
