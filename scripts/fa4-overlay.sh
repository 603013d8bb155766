#!/usr/bin/env bash
# Make a site overlay in which flash_attn.cute is another flash-attn-4 wheel (e.g. 4.0.0b30), next to
# the gpu-kit's install (FA2 + FA4 4.0.0b36), so two FA4 versions can be swept on one machine.
#   bash scripts/fa4-overlay.sh WHEEL OVERLAY_DIR   then   PYTHONPATH=OVERLAY_DIR:$PYTHONPATH attnconf run ...
set -euo pipefail
wheel=$1; overlay=$2; site=/tmp/gpu-kit/site
rm -rf "$overlay" "$overlay.w"; mkdir -p "$overlay"
python3 -m pip install -q --no-index --no-deps --no-compile --target "$overlay.w" "$wheel"
cp -a "$site/flash_attn" "$overlay/" && rm -rf "$overlay/flash_attn/cute"
cp -a "$overlay.w/flash_attn/cute" "$overlay/flash_attn/" && cp -a "$overlay.w"/flash_attn_4-*.dist-info "$overlay/"
PYTHONPATH=$overlay:${PYTHONPATH:-} python3 -c "import importlib.metadata as m, flash_attn.cute as c; print('overlay: flash-attn-4', m.version('flash-attn-4'), c.__file__)"
