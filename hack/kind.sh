#!/usr/bin/env bash
# kind on a host that reaches no image registry (python -m localcluster.kindnode --help):
#   hack/kind.sh node-image   build the node image from local parts, print its name
#   hack/kind.sh config       the kind cluster config that goes with it
#   hack/kind.sh kind         the path of kind, built from its Go module
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ "${1:-}" == node-image ]]; then
  # Its FROM images (debian:bookworm-slim), made locally when they cannot be pulled.
  "$repo/hack/images.sh" bases "$repo/hack/kind/node.Dockerfile" "$repo/hack/kind/component.Dockerfile" >&2
fi
PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" exec python3 -m localcluster.kindnode "$@"
