#!/usr/bin/env bash
# Before a GPU lease, on a machine with a package index: the wheels the GPU image lacks.
#
#   bash scripts/gpu_wheels.sh [ASSETS]      # default .gpu: writes ASSETS/whl/*.whl
#
# The image has jax, flax, optax, orbax, absl-py, PyYAML, numpy, protobuf, msgpack,
# click, requests and attrs (Python 3.12, x86-64) but not ml_collections, which the
# configs import, grain, which the data pipeline imports, or ray and its jsonschema,
# which the launcher needs (scripts/gpu_crash.sh). Ray's wheel (79 MB) is written
# without what a launcher never imports (its Java jars, RLlib, Data, Serve, Tune, Train,
# LLM and the dashboard's web client): 38 MB, so that the wheels stay inside a lease's
# 64 MiB carry. scripts/gpu_mfu.sh, gpu_session.sh and gpu_crash.sh install
# ASSETS/whl/*.whl there. Keep ASSETS out of git (e.g. /.gpu/ in .git/info/exclude).
set -eu
ASSETS=${1:-.gpu}
mkdir -p "$ASSETS/whl"
version() { python3 -c "import importlib.metadata as m; print(m.version('$1'))"; }
download() {
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any \
    -d "$@"
}
download "$ASSETS/whl" ml_collections "grain==$(version grain)" array-record dm-tree \
  more-itertools jsonschema jsonschema-specifications referencing rpds-py
FULL=$(mktemp -d)
download "$FULL" "ray==$(version ray)"
python3 - "$FULL"/ray-*.whl "$ASSETS/whl" <<'EOF'
import os
import sys
import zipfile

src, out = sys.argv[1], sys.argv[2]
drop = tuple(f'ray/{d}/' for d in ('jars', 'rllib', 'data', 'serve', 'tune', 'train', 'llm',
                                   'dashboard/client'))
dst = os.path.join(out, os.path.basename(src))
with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, 'w', zipfile.ZIP_DEFLATED) as zout:
    for info in zin.infolist():
        data = zin.read(info)
        if info.filename.startswith(drop):
            continue
        if info.filename.endswith('.dist-info/RECORD'):  # what pip installs: the files kept
            data = b''.join(line + b'\n' for line in data.splitlines()
                            if not line.decode().startswith(drop))
        zout.writestr(info, data)
print(f'{dst}: {os.path.getsize(dst) / 2**20:.1f} MiB')
EOF
rm -r "$FULL"
ls -l "$ASSETS/whl"; du -sh "$ASSETS/whl"
