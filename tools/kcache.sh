#!/usr/bin/env bash
# Build .kcache (tools/kcache.py) with the GPU image's NVRTC, in a venv of its own:
#   tools/kcache.sh --plan 108 --plan 109 --plan 104 [--tests tests/gpu] [--variants] [SET ...]
# (~20 s per build on one core of the 2-core machine; a rebuild reuses what .kcache holds).
# Then carry .kcache with the device calls: tools/gpu_session.sh installs it.
set -euo pipefail
cd "$(dirname "$0")/.."
V=${KCACHE_VENV:-/tmp/kcv}
NVRTC=${KCACHE_NVRTC:-13.0.88}     # the H200 image's nvidia-cuda-nvrtc (hooks.md, gpu_tests.md)
if [ ! -x "$V/bin/python" ]; then
  python3 -m venv "$V"
  "$V/bin/pip" install -q "nvidia-cuda-nvrtc==$NVRTC" "cuda-bindings>=13.0,<14" numpy pyyaml msgpack \
      pytest hypothesis pytest-timeout
  "$V/bin/pip" install -q --no-deps -e .
fi
exec "$V/bin/python" tools/kcache.py build .kcache "$@"
