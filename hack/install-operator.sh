#!/usr/bin/env bash
# Install the operator and only its dependencies (no torch, no TensorFlow).
# The operator image runs exactly this; tests/operator/packaging/test_install.py runs it too.
#   hack/install-operator.sh [SOURCE_DIR]     (PIP=/path/to/pip to choose the environment)
set -euo pipefail
src="${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
"${PIP:-pip}" install --no-cache-dir "${src}[operator]"
