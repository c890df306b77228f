#!/usr/bin/env bash
# Build what the later tests need, ahead of them, at the lowest CPU and I/O
# priority: .ci/run starts this beside pytest. Two lanes run side by side:
#   Go tools  the ones tests build on first use, in the order the suite needs them
#             (Kueue, the gang schedulers, the benchmark's peers, the kind node's),
#             so that a test finds its tool built instead of compiling it inside
#             its own timeout; the machine-wide Go build lock keeps one compile at
#             a time, and a test waiting on it uses the tool this lane just built;
#   images    the operator image, the four worker images and the kind node image,
#             which tests/conftest.py runs last (hack/images.sh and hack/kind.sh
#             take a lock per image, so a test waits for this lane's build and then
#             finds it in the cache).
# Both only fill caches: the tests build and check what they use themselves, and
# fail on a build that fails.
#   hack/warm-up.sh            start a Docker engine when none answers (niced, so
#                              every build and container it runs is too), then both lanes
#   hack/warm-up.sh --help     this text
# Exits non-zero when a step failed (each step still runs); a dockerd it started is
# stopped by `hack/images.sh engine-stop`, which .ci/run calls at its end.
set -uo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
say() { printf '[warm-up] %s\n' "$*" >&2; }
case "${1:-}" in
  -h | --help) sed -n '2,/^set -uo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
  "") ;;
  *) say "unknown argument: $1 (see --help)"; exit 2 ;;
esac

# Lowest priority for this shell and so for everything it starts (dockerd among them).
renice -n 19 -p $$ >/dev/null
ionice -c 2 -n 7 -p $$ 2>/dev/null || true

# nice alone does not keep these builds off the tests' CPU: with autogroups (Linux's
# default) it counts only within a session, and the build steps run in Docker's
# cgroups. Idle cgroups do (cgroup v1's cpu.idle: CPU only when nothing else wants
# it), for this script with the dockerd it starts and for Docker's containers, until
# this script ends.
cpu=/sys/fs/cgroup/cpu
idle=0
restore() {
  ((idle)) || return 0
  echo 0 >"$cpu/docker/cpu.idle" 2>/dev/null || true
  local pid
  while read -r pid; do echo "$pid" >"$cpu/cgroup.procs" 2>/dev/null || true; done <"$cpu/warm-up/cgroup.procs"
  rmdir "$cpu/warm-up" 2>/dev/null || true
  say "Docker's containers and the dockerd started here are back at normal priority"
}
trap restore EXIT
trap 'exit 143' TERM INT
if [[ -w "$cpu/cgroup.procs" && -e "$cpu/cpu.idle" ]] && mkdir -p "$cpu/warm-up" "$cpu/docker" 2>/dev/null &&
  echo 1 >"$cpu/warm-up/cpu.idle" && echo 1 >"$cpu/docker/cpu.idle" && echo $$ >"$cpu/warm-up/cgroup.procs"; then
  idle=1
  say "building in idle cgroups ($cpu/warm-up, $cpu/docker)"
else
  say "no cgroup v1 cpu.idle to build in (needs root): nice only, so the tests share the CPU with these builds"
fi

failed=()
# A step's output goes to this log as it comes; a failed one's last lines are repeated
# after its "failed" line, which hack/ci-times.py shows in CI's output (the two lanes'
# lines interleave here, so the cause is hard to find by reading).
step() {
  local start=$SECONDS out rc
  out="$(mktemp)"
  say "$* ..."
  "$@" 2>&1 | tee "$out"
  rc=${PIPESTATUS[0]}
  if ((rc == 0)); then
    say "$*: done in $((SECONDS - start))s"
  else
    say "$*: failed (exit $rc) after $((SECONDS - start))s; the tests that need it build it themselves"
    tail -n 15 "$out" | sed 's/^/[warm-up]   | /' >&2
    failed+=("$*")
  fi
  rm -f "$out"
  return "$rc"
}
# An image build reaches PyPI and keeps a BuildKit session open for its whole length:
# one that failed is tried once more (CI of 2026-12-05: tf-gpu failed after 26 s in the
# warm-up and then built inside a test, 28 minutes of that test's stream).
image_step() {
  step "$@" && return 0
  say "$*: trying once more"
  failed=("${failed[@]:0:${#failed[@]}-1}")
  step "$@"
}
# A GPU image whose tests will read the record of a build of these exact inputs
# (localcluster/image_record.py: its tests' fixture decides the same way) is not
# built here: each compiles Horovod with CUDA, the longest steps of a cold run.
answered_from_record() {
  local target=$1 docker
  [[ "${HVK_GPU_IMAGES:-auto}" == auto && -x .venv/bin/python ]] || return 1
  .venv/bin/python -m localcluster.image_record check "$target" >/dev/null || return 1
  docker="$(hack/images.sh cli)" || return 1
  if "$docker" image inspect "horovod-worker:$(hack/images.sh version)-$target" >/dev/null 2>&1; then
    return 1 # built here before: its tests read the image, and the build checks it is current
  fi
  say "$target: not built; its tests read $(.venv/bin/python -m localcluster.image_record show "$target")"
}
finish_lane() {
  if ((${#failed[@]})); then
    say "$1 lane failed: ${failed[*]}"
    return 1
  fi
  say "$1 lane: everything built"
}

# kubelet, kubeadm and kube-proxy first, while the Go build cache still holds what
# the control plane compiled from the same go.mod (gobuild empties it past its cap);
# then in the order the suite needs them: tests/operator/integration (test_kueue*,
# test_podgroups, test_volcano), tests/tooling/integration (test_bench_quick's
# peers), then the rest of the kind rung's node (tests/e2e/kind, a Docker test).
go_tools() {
  for tool in kubernetes-node kueue scheduler-plugins volcano mpi-operator trainer jobset \
    kind containerd runc cri-tools cni-plugins; do
    step hack/cluster.sh build "$tool"
  done
  finish_lane "Go tools"
}

images() {
  local start=$SECONDS
  step hack/images.sh engine
  image_step hack/images.sh operator
  # In the order the tests ask for them: the kind test's two and its node image, then
  # the GPU images. The node image took 963 s inside the kind test on a new machine
  # (2026-12-06), the longest step of the longer test stream; its tools come from the
  # Go lane (gobuild's lock: one compile at a time), and its own lock makes the kind
  # test wait for this build instead of making a second one.
  for target in torch-cpu tf-cpu; do
    image_step hack/images.sh worker "$target"
  done
  image_step hack/kind.sh node-image
  for target in torch-gpu tf-gpu; do
    if answered_from_record "$target"; then continue; fi
    image_step hack/images.sh worker "$target"
  done
  # Every image built: the build cache no image holds is what older inputs left (KEEP
  # spans this lane and half an hour more). Not after a failure, whose retry may want it.
  if ((${#failed[@]} == 0)); then
    step hack/images.sh prune "$(((SECONDS - start) / 60 + 30))m"
  fi
  finish_lane "images"
}

go_tools &
tools=$!
rc=0
images || rc=1
wait "$tools" || rc=1
exit "$rc"
