#!/usr/bin/env bash
# Build the images the Docker tests use, ahead of them, at the lowest CPU and I/O
# priority: .ci/run starts this beside pytest, and tests/conftest.py runs the tests
# that use Docker last, so these builds (20+ minutes on a cold machine) overlap the
# tests that need none instead of adding to them. It only fills the build cache: the
# tests build each image themselves all the same (seconds when it is cached, a wait
# for this script when it is building that image: hack/images.sh takes a lock per
# image) and fail on a build that fails.
#   hack/warm-images.sh            start a Docker engine when none answers (niced, so
#                                  every build and container it runs is too), then the
#                                  operator image and the four worker images
#   hack/warm-images.sh --help     this text
# The kind node image is left to its test: its Go builds take the machine-wide Go
# build lock, and a test waiting on that lock could run past its timeout.
# Exits non-zero when a step failed (each step still runs); a dockerd it started is
# stopped by `hack/images.sh engine-stop`, which .ci/run calls at its end.
set -uo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
say() { printf '[warm-images] %s\n' "$*" >&2; }
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
  while read -r pid; do echo "$pid" >"$cpu/cgroup.procs" 2>/dev/null || true; done <"$cpu/warm-images/cgroup.procs"
  rmdir "$cpu/warm-images" 2>/dev/null || true
  say "Docker's containers and the dockerd started here are back at normal priority"
}
trap restore EXIT
trap 'exit 143' TERM INT
if [[ -w "$cpu/cgroup.procs" && -e "$cpu/cpu.idle" ]] && mkdir -p "$cpu/warm-images" "$cpu/docker" 2>/dev/null &&
  echo 1 >"$cpu/warm-images/cpu.idle" && echo 1 >"$cpu/docker/cpu.idle" && echo $$ >"$cpu/warm-images/cgroup.procs"; then
  idle=1
  say "building in idle cgroups ($cpu/warm-images, $cpu/docker)"
else
  say "no cgroup v1 cpu.idle to build in (needs root): nice only, so the tests share the CPU with these builds"
fi

failed=()
step() {
  local start=$SECONDS
  say "$* ..."
  if "$@"; then
    say "$*: done in $((SECONDS - start))s"
  else
    say "$*: failed (exit $?) after $((SECONDS - start))s; the tests that need it build it themselves"
    failed+=("$*")
  fi
}

step hack/images.sh engine
step hack/images.sh operator
# In the order the tests ask for them: the kind test's two, then the GPU images.
for target in torch-cpu tf-cpu torch-gpu tf-gpu; do
  step hack/images.sh worker "$target"
done
if ((${#failed[@]})); then
  say "failed: ${failed[*]}"
  exit 1
fi
say "every image built"
