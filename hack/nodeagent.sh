#!/usr/bin/env bash
# The local node agent: runs the pods bound to its nodes as processes
# (python -m localcluster.nodeagent --help; docs/dev/local-e2e.md).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="$repo/.venv/bin/python"
if [[ ! -x "$py" ]]; then
  echo "error: $py is missing. Fix: hack/bootstrap.sh" >&2
  exit 1
fi
PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" exec "$py" -m localcluster.nodeagent "$@"
