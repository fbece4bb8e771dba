#!/usr/bin/env bash
# The Neural Compressor anchor of benchmarks/auto_optimize.py in its own environment, ./.venv-inc: INC's ONNX Runtime
# line (onnx-neural-compressor 1.0) pins numpy < 2 and needs scipy and prettytable it does not declare; npukit's
# .venv keeps numpy 2. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
[ -x .venv-inc/bin/python ] || "$PY" -m venv .venv-inc
.venv-inc/bin/python -m pip install -q --disable-pip-version-check "onnx-neural-compressor==1.0" "numpy==1.26.4" \
  "onnx==1.23.2" "onnxruntime==1.32.0" "scipy==1.17.1" "prettytable==3.18.0" 2>&1 \
  | { grep -v -E "^WARNING: Location .* is ignored" || true; }
.venv-inc/bin/python -c "import onnx_neural_compressor.quantization.tuning"
