#!/usr/bin/env bash
# Install the worker's frameworks from PyPI (wheels only, pinned) into a Python
# environment: the first half of hack/install-worker.sh, which runs this script.
# Dockerfile.worker runs it alone, in a layer of its own before Horovod's build,
# so that a change to the Horovod build never downloads the frameworks again.
#
#   hack/install-frameworks.sh [--python PATH] [--frameworks LIST] [--gpu]
#                              [--wheelhouse DIR [--download-only]]
#
#   --python PATH       interpreter of the target environment
#                       (default: .venv/bin/python of the repository, or $PYTHON)
#   --frameworks LIST   comma-separated subset of pytorch,tensorflow
#                       (default: pytorch,tensorflow)
#   --gpu               tensorflow[and-cuda] (its own CUDA 12 wheels) instead of
#                       tensorflow-cpu. torch is the same either way: PyPI's torch
#                       is a CUDA build that brings its nvidia-* wheels (CUDA 13)
#   --wheelhouse DIR    first download the wheels into DIR (pip skips those it
#                       has), then install from DIR alone: a second environment,
#                       a fresh clone's say, copies 3 GB from disk instead of
#                       fetching them again (default: $WORKER_WHEELHOUSE, which
#                       hack/bootstrap.sh sets to ~/.cache/horovod-operator/wheelhouse)
#   --download-only     with --wheelhouse: download, install nothing (bootstrap
#                       runs this beside the Go builds: network beside CPU)
#
# Versions: hack/versions.env (section "Worker"). A variable already set in the
# environment wins over the file, and the file may be absent when every variable
# needed is set: Dockerfile.worker passes the pins as build arguments and copies
# no versions.env, so that a change to an unrelated pin rebuilds nothing.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

log() { printf '[install-frameworks] %s\n' "$*" >&2; }
die() { printf '[install-frameworks] error: %s\n' "$*" >&2; exit 1; }

PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
FRAMEWORKS="pytorch,tensorflow"
GPU=0
WHEELHOUSE="${WORKER_WHEELHOUSE:-}"
DOWNLOAD_ONLY=0
while (($#)); do
    case "$1" in
        --python) PYTHON="${2:?--python needs a path}"; shift 2 ;;
        --python=*) PYTHON="${1#*=}"; shift ;;
        --frameworks) FRAMEWORKS="${2:?--frameworks needs a list}"; shift 2 ;;
        --frameworks=*) FRAMEWORKS="${1#*=}"; shift ;;
        --gpu) GPU=1; shift ;;
        --wheelhouse) WHEELHOUSE="${2:?--wheelhouse needs a directory}"; shift 2 ;;
        --wheelhouse=*) WHEELHOUSE="${1#*=}"; shift ;;
        --download-only) DOWNLOAD_ONLY=1; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument: $1 (see --help)" ;;
    esac
done

WITH_TORCH=0
WITH_TF=0
IFS=',' read -ra _fws <<<"$FRAMEWORKS"
for fw in "${_fws[@]}"; do
    case "$fw" in
        pytorch|torch) WITH_TORCH=1 ;;
        tensorflow|tf) WITH_TF=1 ;;
        *) die "unknown framework '$fw' in --frameworks (expected pytorch,tensorflow)" ;;
    esac
done
((WITH_TORCH || WITH_TF)) || die "--frameworks selects nothing"
((!DOWNLOAD_ONLY)) || [[ -n "$WHEELHOUSE" ]] || die "--download-only needs --wheelhouse DIR"

# ---- pinned versions (the environment wins over hack/versions.env) -----------
needed=(NUMPY_VERSION SCIKIT_LEARN_VERSION TENSORBOARD_VERSION)
((WITH_TORCH)) && needed+=(TORCH_VERSION TORCHVISION_VERSION)
((WITH_TF)) && needed+=(TENSORFLOW_VERSION TF_KERAS_VERSION)
declare -A preset=()
for var in "${needed[@]}"; do
    if [[ -n "${!var:-}" ]]; then preset[$var]="${!var}"; fi
done
if [[ -f "$ROOT/hack/versions.env" ]]; then
    # shellcheck source=versions.env
    source "$ROOT/hack/versions.env"
fi
for var in "${!preset[@]}"; do printf -v "$var" '%s' "${preset[$var]}"; done
for var in "${needed[@]}"; do
    [[ -n "${!var:-}" ]] || die "$var is set neither in the environment nor in hack/versions.env"
done
if ((WITH_TF)); then
    [[ "$TF_KERAS_VERSION" == "$TENSORFLOW_VERSION" ]] ||
        die "TF_KERAS_VERSION ($TF_KERAS_VERSION) must equal TENSORFLOW_VERSION ($TENSORFLOW_VERSION)"
fi

[[ -x "$PYTHON" ]] || die "no Python at $PYTHON: create the venv first (python3 -m venv .venv) or pass --python"
"$PYTHON" -m pip --version >/dev/null 2>&1 || die "$PYTHON has no pip"

pip_installed() { # name -> version or empty
    "$PYTHON" - "$1" <<'EOF'
import sys
from importlib import metadata
try:
    print(metadata.version(sys.argv[1]))
except metadata.PackageNotFoundError:
    pass
EOF
}

# tensorflow-cpu by default; with --gpu the full build with its own CUDA 12
# libraries from pip ([and-cuda]). Never both in one environment: they write the
# same files.
TF_DIST="tensorflow-cpu"
TF_SPEC="tensorflow-cpu==${TENSORFLOW_VERSION:-}"
if ((GPU)); then
    TF_DIST="tensorflow"
    TF_SPEC="tensorflow[and-cuda]==${TENSORFLOW_VERSION:-}"
fi

START=$SECONDS
pkgs=(
    "numpy==$NUMPY_VERSION" "scikit-learn==$SCIKIT_LEARN_VERSION"
    "tensorboard==$TENSORBOARD_VERSION"
    # Horovod's runtime and build dependencies (built with --no-build-isolation).
    cloudpickle psutil pyyaml packaging cffi "setuptools>=69" wheel
)
# torchvision (horovod_worker.benchmark's models) is pinned to the one release built
# against this torch, so that pip never swaps torch for another version.
((WITH_TORCH)) && pkgs+=("torch==$TORCH_VERSION" "torchvision==$TORCHVISION_VERSION")
((WITH_TF)) && pkgs+=("$TF_SPEC")
PREFIX="$("$PYTHON" -c 'import sys; print(sys.prefix)')"
PIP_LOG="$(mktemp)"
trap 'rm -f "$PIP_LOG"' EXIT
# --only-binary: nothing here may compile (torch alone is several GB of wheels).
# A dropped connection in the middle of a wheel of hundreds of MB is the usual
# failure (seen in CI on nvidia-cublas): pip's own --retries covers a refused
# connection but not a broken read, so the whole command is retried (with a
# wheelhouse, the wheels that finished are in it and are not fetched again).
pip_retried() {
    local attempt=1 where="$PREFIX"
    [[ "$1" == download ]] && where="$WHEELHOUSE"
    until "$PYTHON" -m pip "$@" >"$PIP_LOG" 2>&1; do
        tail -n 20 "$PIP_LOG" >&2
        # A full disk is no dropped connection: a retry finds the half-written packages
        # "already satisfied" and would report the frameworks ready.
        if grep -q 'No space left on device' "$PIP_LOG"; then
            die "no space left on the disk of $where (df: $(df -Pm "$where" | awk 'NR == 2 {print $4}') MB free); pip $1 stopped half way. Fix: free space (docker builder prune, docker image prune), then rerun"
        fi
        ((attempt < ${PIP_ATTEMPTS:-4})) || die "pip could not $1 the frameworks after $attempt attempts (log above)"
        log "pip $1 failed (attempt $attempt); retrying in $((attempt * 15)) s"
        sleep $((attempt * 15))
        attempt=$((attempt + 1))
    done
}
source_args=()
if [[ -n "$WHEELHOUSE" ]]; then
    mkdir -p "$WHEELHOUSE"
    log "downloading into $WHEELHOUSE (wheels it holds are kept): ${pkgs[*]}"
    pip_retried download --only-binary=:all: --progress-bar off --retries 10 --timeout 120 \
        -d "$WHEELHOUSE" "${pkgs[@]}"
    log "wheelhouse ready: $(grep -c '^Saved ' "$PIP_LOG" || true) wheels fetched now ($((SECONDS - START)) s)"
    ((!DOWNLOAD_ONLY)) || exit 0
    source_args=(--no-index --find-links "$WHEELHOUSE")
fi
log "installing into $PREFIX: ${pkgs[*]}"
pip_retried install --only-binary=:all: --progress-bar off --retries 10 --timeout 120 \
    "${source_args[@]}" "${pkgs[@]}"
grep '^Successfully installed' "$PIP_LOG" >&2 || log "already installed"
if ((WITH_TF)); then
    # tf-keras depends on "tensorflow", which would pull the GPU build on top of
    # tensorflow-cpu (both write the same files); it needs nothing else.
    "$PYTHON" -m pip install --no-deps --progress-bar off -q "tf-keras==$TF_KERAS_VERSION"
    if [[ "$TF_DIST" == "tensorflow-cpu" && -n "$(pip_installed tensorflow)" ]]; then
        log "removing the GPU 'tensorflow' dist that shadows tensorflow-cpu"
        "$PYTHON" -m pip uninstall -y -q tensorflow
        "$PYTHON" -m pip install --no-deps --force-reinstall --progress-bar off -q \
            "tensorflow-cpu==$TENSORFLOW_VERSION"
    fi
fi
# Each framework must import: pip's "already satisfied" reads only the metadata.
checks=()
((WITH_TORCH)) && checks+=("import torch, torchvision")
((WITH_TF)) && checks+=("import tensorflow, tf_keras")
for check in "${checks[@]}"; do
    TF_CPP_MIN_LOG_LEVEL=3 "$PYTHON" -c "$check" >/dev/null 2>&1 ||
        die "'$check' fails in $PREFIX after the install: run $PYTHON -c '$check' to see why"
done
log "frameworks ready ($((SECONDS - START)) s)"
