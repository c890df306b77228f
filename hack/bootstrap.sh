#!/usr/bin/env bash
# Install everything the tests and the demo need on a fresh Debian machine.
# Idempotent: a second run takes seconds (pip and Go caches live in ~/.cache).
#   hack/bootstrap.sh            system packages, .venv with the operator and dev tools,
#                                the local control plane binaries, the worker frameworks
#   SKIP_WORKER=1 hack/bootstrap.sh   everything but torch/TensorFlow/Horovod
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
say() { printf '[bootstrap] %4ds %s\n' "$SECONDS" "$*" >&2; }

need_pkgs=()
for pair in openssl:openssl ip:iproute2 sshd:openssh-server ssh:openssh-client; do
  cmd="${pair%%:*}"; pkg="${pair#*:}"
  command -v "$cmd" >/dev/null 2>&1 || [[ -x "/usr/sbin/$cmd" ]] || need_pkgs+=("$pkg")
done
if ((${#need_pkgs[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    say "missing system packages: ${need_pkgs[*]}. Fix: sudo apt-get install -y ${need_pkgs[*]}"
    exit 1
  fi
  say "installing system packages: ${need_pkgs[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
fi

# The image tools: hack/images.sh starts its own dockerd (docker.io) and makes the
# base images it cannot pull (mmdebstrap); hack/kind.sh compiles the node image's
# pause (gcc, libc6-dev) and runc with seccomp (libseccomp-dev). Root only: without
# them the image and kind tests skip (and fail under CI=1). The packages must not start their services here
# (hack/images.sh starts the daemon it uses), so a policy-rc.d that refuses every
# start stands in for the install when the machine has none.
image_pkgs=()
for pair in dockerd:docker.io mmdebstrap:mmdebstrap gcc:gcc; do
  cmd="${pair%%:*}"; pkg="${pair#*:}"
  command -v "$cmd" >/dev/null 2>&1 || [[ -x "/usr/sbin/$cmd" ]] || image_pkgs+=("$pkg")
done
for pair in /usr/include/seccomp.h:libseccomp-dev /usr/include/stdio.h:libc6-dev; do
  [[ -e "${pair%%:*}" ]] || image_pkgs+=("${pair#*:}")
done
if ((${#image_pkgs[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    say "not installing ${image_pkgs[*]} (needs root); the image tests will skip. Fix: sudo apt-get install -y ${image_pkgs[*]}"
  else
    say "installing the image tools: ${image_pkgs[*]}"
    made_policy=0
    if [[ ! -e /usr/sbin/policy-rc.d ]]; then
      printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d
      made_policy=1
    fi
    rc=0
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        --no-install-recommends "${image_pkgs[@]}" >/dev/null; } || rc=$?
    if ((made_policy)); then rm -f /usr/sbin/policy-rc.d; fi
    ((rc == 0)) || { say "apt-get install ${image_pkgs[*]} failed (exit $rc)"; exit "$rc"; }
  fi
fi

if ! command -v go >/dev/null 2>&1; then
  say "Go is not installed. Fix: install Go 1.26 or newer (https://go.dev/doc/install)."
  exit 1
fi
py="${PYTHON:-python3}"
if ! "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  say "$py is older than 3.11. Fix: install Python 3.11+ or set PYTHON=/path/to/python3.11"
  exit 1
fi

# What an earlier clone's bootstrap installed, hard-linked into a new .venv (seconds,
# where pip unpacked the frameworks' 3 GB of wheels again in ~110 s); pip and
# hack/install-frameworks.sh below still check every pin and import each framework.
# Only a .venv made here is saved: one a developer added packages to by hand would
# carry them into every later clone, and hide a dependency pyproject.toml lacks.
frameworks_tree=(.venv/bin/python hack/frameworks_tree.py --cache "$HOME/.cache/horovod-operator/frameworks")
fresh_venv=0
if [[ ! -x .venv/bin/python ]]; then
  say "creating .venv"
  "$py" -m venv .venv
  fresh_venv=1
  if [[ "${SKIP_WORKER:-0}" != 1 ]]; then
    "${frameworks_tree[@]}" restore --venv .venv
  fi
fi
say "installing the operator, the SDK, dev and benchmark tools into .venv"
.venv/bin/pip install -q --upgrade pip >/dev/null
.venv/bin/pip install -q -e '.[operator,sdk,dev,bench]'

# The worker's frameworks (3 GB of wheels) are fetched into a wheelhouse beside the
# Go builds below, network beside CPU, and installed from it after them; a fresh
# clone then installs them from disk.
export WORKER_WHEELHOUSE="${WORKER_WHEELHOUSE:-$HOME/.cache/horovod-operator/wheelhouse}"
fetch_pid=""
fetch_log=".work/bootstrap-wheelhouse.log"
if [[ "${SKIP_WORKER:-0}" != 1 ]]; then
  mkdir -p .work
  say "fetching the worker frameworks into $WORKER_WHEELHOUSE beside the Go builds (log: $fetch_log)"
  hack/install-frameworks.sh --download-only >"$fetch_log" 2>&1 &
  fetch_pid=$!
fi

say "building the local control plane (cached after the first run)"
hack/cluster.sh build
say "building CoreDNS for the local node agent (cached after the first run)"
hack/nodeagent.sh build

if [[ -n "$fetch_pid" ]]; then
  if wait "$fetch_pid"; then
    say "$(tail -n 1 "$fetch_log")"
  else
    # Not fatal: the install below downloads what is missing (and says why it cannot).
    tail -n 20 "$fetch_log" >&2
    say "fetching the frameworks beside the Go builds failed (above); the install tries again"
  fi
fi
if [[ "${SKIP_WORKER:-0}" != 1 ]]; then
  say "installing the worker frameworks and Horovod (cached after the first run)"
  worker_args=()
  # Build tools and Open MPI come from apt the first time only.
  for tool in cmake g++ patch mpirun mpicxx; do
    if ! command -v "$tool" >/dev/null 2>&1; then worker_args=(--apt); break; fi
  done
  if ((${#worker_args[@]})) && [[ $(id -u) -ne 0 ]]; then
    say "missing build tools or Open MPI. Fix: sudo apt-get install -y cmake build-essential patch openmpi-bin libopenmpi-dev"
    exit 1
  fi
  hack/install-worker.sh "${worker_args[@]}"
  if ((fresh_venv)); then "${frameworks_tree[@]}" save --venv .venv; fi
fi
say "done"
