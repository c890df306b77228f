#!/usr/bin/env bash
# Every test, as CI runs them (`make test` and .ci/run): what the later tests build
# on first use (Go tools, then images) builds beside the earlier tests at the lowest
# priority (hack/warm-up.sh; tests/conftest.py runs the Docker tests last, and the
# tests still build and check what they use themselves), then where the time went
# (hack/ci-times.py: each test tier, the slowest tests, the warm-up's builds).
#
# The whole suite runs as two pytest streams side by side, because its tests mostly
# wait (a control plane, a deadline, a scheduler), not compute: 75 % of two cores sat
# idle through the integration tier run alone (2026-12-05). tests/conftest.py splits
# them (the `stream_b` marker):
#   stream A  unit and integration tests and part of the training tier, on the test
#             control plane (ports 17400+); its output here as it comes;
#   stream B  e2e (their own control plane, 17500+, and the node agent), the rest of
#             the training tier, and every Docker test last (its own test control
#             plane, 17700+, for the operator image's test); its log is
#             .work/ci/stream-b.log, shown here once stream A is done.
# Nothing is shared between the streams but the build locks (gobuild, images.sh).
#   hack/test.sh                    both streams; HVK_TEST_STREAMS=1: one, as before
#   hack/test.sh [PYTEST ARGS...]   one stream with those arguments
# The junit files are .work/ci/junit.xml (and junit-b.xml), the warm-up's log
# .work/warm-up.log. The dockerd the warm-up starts is stopped here at the end.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
mkdir -p .work/ci
rm -f .work/ci/junit.xml .work/ci/junit-b.xml
setsid hack/warm-up.sh >.work/warm-up.log 2>&1 </dev/null &
warm=$!
second=""
finish() {
  if [[ -n $second ]]; then
    kill -TERM -- "-$second" 2>/dev/null || true
    wait "$second" 2>/dev/null || true
  fi
  kill -TERM -- "-$warm" 2>/dev/null || true
  wait "$warm" 2>/dev/null || true
  hack/images.sh engine-stop || true
  python3 hack/ci-times.py --junit .work/ci/junit.xml --junit .work/ci/junit-b.xml \
    --warm-up .work/warm-up.log --slowest 25 || true
}
trap finish EXIT
pytest=(.venv/bin/pytest -ra --durations=25)

if (($#)) || [[ ${HVK_TEST_STREAMS:-2} == 1 ]]; then
  "${pytest[@]}" --junitxml=.work/ci/junit.xml "$@"
  exit
fi

log_b=.work/ci/stream-b.log
echo "[test] stream B (e2e, training, Docker) runs beside this one; its log: $log_b"
HVK_TEST_DIR="$PWD/.work/test-cluster-b" HVK_TEST_PORT_BASE=17700 \
  setsid "${pytest[@]}" --junitxml=.work/ci/junit-b.xml -o cache_dir=.work/ci/pytest-cache-b \
  -m stream_b >"$log_b" 2>&1 </dev/null &
second=$!
rc_a=0
"${pytest[@]}" --junitxml=.work/ci/junit.xml -m "not stream_b" ||
  rc_a=$?
echo "[test] stream A ended (exit $rc_a); stream B's log from its start, until it ends:"
tail -n +1 -f --pid="$second" "$log_b"
rc_b=0
wait "$second" || rc_b=$?
second=""
echo "[test] stream A exit $rc_a, stream B exit $rc_b"
exit $((rc_a ? rc_a : rc_b))
