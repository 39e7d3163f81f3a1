#!/usr/bin/env bash
# Set up a virtual environment with the server, the test tools, the CPU build of torch
# and the trainer packages the plugin tests run against, then run the tests.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -k plans -x`. The tests run in
# ROLLPLAN_TEST_WORKERS processes (pytest-xdist, default 4: most of a test's time is spent
# waiting on servers, databases and subprocesses; `-n 0` runs them in this process).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
PIP=(.venv/bin/python -m pip install -q)
"${PIP[@]}" --upgrade pip
# torch first, pinned: a plain `torch` requirement would pull a multi-GB CUDA build.
"${PIP[@]}" torch==2.13.0
"${PIP[@]}" -e '.[dev,bench,trl,verl]'
# OpenRLHF hard-pins flash-attn and vLLM (GPU only); the plugin tests use the parts that
# import on a CPU machine.
"${PIP[@]}" --no-deps 'openrlhf==0.11.2'
# One BLAS / OpenMP / torch thread per test process: the workers already share the CPUs,
# and threads that spin-wait for each other's cores slow every test (set them to override).
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1} MKL_NUM_THREADS=${MKL_NUM_THREADS:-1}
exec .venv/bin/python -m pytest -n "${ROLLPLAN_TEST_WORKERS:-4}" "$@"
