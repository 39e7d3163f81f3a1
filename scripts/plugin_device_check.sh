#!/usr/bin/env bash
# The TRL plugin tests on a CUDA GPU (run on the device machine from the repo root).
# The machine's image has torch/transformers/accelerate but no trl/datasets/server deps:
# bring them as py3.12 wheels first, here (build/ is git-ignored; carry "build/whl"):
#   P="--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any"
#   for w in trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 fastapi==0.165.0 starlette==1.10.0 \
#            sqlalchemy==2.1.9 greenlet alembic==1.20.1 mako pydantic==2.14.4 pydantic-core==2.50.5 \
#            pydantic-settings==2.16.3 python-dotenv annotated-types typing-inspection uvicorn; do
#     pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $P -d build/whl "$w"; done
set -e
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site build/whl/*.whl
# the rollplan namespace without installing (package-dir mapping of pyproject.toml)
mkdir -p /tmp/rp && rm -rf /tmp/rp/rollplan && cp -r clients /tmp/rp/rollplan
for pair in service:service trainer_plugins:plugins migrations:migrations benchmarks:benchmarks; do
  ln -s "$PWD/${pair%%:*}" "/tmp/rp/rollplan/${pair##*:}"
done
export PYTHONPATH=/tmp/rp:/tmp/site PYTHONUNBUFFERED=1 ROLLPLAN_REQUIRE_TRAINERS=1 ROLLPLAN_TEST_CUDA=1 HOME=/tmp/home
nvidia-smi -L
python3 -c "import torch, transformers, trl; print(torch.__version__, torch.cuda.is_available(), transformers.__version__, trl.__version__)"
python3 -m pytest -q -p no:cacheprovider tests/test_plugin_core.py tests/test_plugin_trl.py 2>&1 | tee "${OUT:-/tmp}/pytest.log" | tail -25
