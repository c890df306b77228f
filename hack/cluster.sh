#!/usr/bin/env bash
# Build and run the local Kubernetes control plane (python -m localcluster --help).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="$(command -v python3 || true)"
if [[ -z "$py" ]]; then
  echo "error: python3 is not installed. Fix: apt-get install -y python3" >&2
  exit 1
fi
# The package is standard library only: this runs before any virtualenv exists.
PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" exec "$py" -m localcluster "$@"
