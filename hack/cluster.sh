#!/usr/bin/env bash
# Build and run the local Kubernetes control plane (see hack/cluster.py --help).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
py="$(command -v python3 || true)"
if [[ -z "$py" ]]; then
  echo "error: python3 is not installed. Fix: apt-get install -y python3" >&2
  exit 1
fi
exec "$py" "$here/cluster.py" "$@"
