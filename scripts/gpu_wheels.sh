#!/usr/bin/env bash
# Before a GPU lease, on a machine with a package index: the wheels the GPU image lacks.
#
#   bash scripts/gpu_wheels.sh [ASSETS]      # default .gpu: writes ASSETS/whl/*.whl
#
# The image has jax, flax, optax, absl-py, PyYAML and numpy (Python 3.12, x86-64) but not
# ml_collections, which the configs import. scripts/gpu_mfu.sh and scripts/gpu_session.sh
# install ASSETS/whl/*.whl there. Keep ASSETS out of git (e.g. /.gpu/ in .git/info/exclude).
set -eu
ASSETS=${1:-.gpu}
mkdir -p "$ASSETS/whl"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux2014_x86_64 --platform any \
  -d "$ASSETS/whl" ml_collections
ls -l "$ASSETS/whl"
