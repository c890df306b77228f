#!/usr/bin/env bash
# Every test, as CI runs them (`make test` and .ci/run): what the later tests build
# on first use (Go tools, then images) builds beside the earlier tests at the lowest
# priority (hack/warm-up.sh; tests/conftest.py runs the Docker tests last, and the
# tests still build and check what they use themselves), then where the time went
# (hack/ci-times.py: each test tier, the slowest tests, the warm-up's builds).
#   hack/test.sh [PYTEST ARGS...]   after hack/bootstrap.sh; the junit file is
#                                   .work/ci/junit.xml, the warm-up's log .work/warm-up.log
# The dockerd the warm-up starts is stopped here at the end.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
mkdir -p .work/ci
setsid hack/warm-up.sh >.work/warm-up.log 2>&1 </dev/null &
warm=$!
finish() {
  kill -TERM -- "-$warm" 2>/dev/null || true
  wait "$warm" 2>/dev/null || true
  hack/images.sh engine-stop || true
  python3 hack/ci-times.py --junit .work/ci/junit.xml --warm-up .work/warm-up.log \
    --slowest 25 || true
}
trap finish EXIT
.venv/bin/pytest -ra --durations=25 --junitxml=.work/ci/junit.xml "$@"
