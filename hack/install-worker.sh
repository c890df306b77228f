#!/usr/bin/env bash
# Install the worker's frameworks and build Horovod into a Python environment.
#
# The same script runs here (tests, CI) and in Dockerfile.worker, so the image
# and the tests install the same way. Every version is pinned in
# hack/versions.env (section "Worker").
#
#   hack/install-worker.sh [--python PATH] [--nccl] [--frameworks LIST]
#                          [--apt] [--no-cache] [--check]
#
#   --python PATH       interpreter of the target environment
#                       (default: .venv/bin/python of the repository, or $PYTHON)
#   --nccl              build Horovod with NCCL for GPUs (the worker image); also
#                       installs tensorflow[and-cuda] instead of tensorflow-cpu
#   --frameworks LIST   comma-separated subset of pytorch,tensorflow
#                       (default: pytorch,tensorflow)
#   --apt               first apt-get install the Debian/Ubuntu prerequisites
#                       (build tools, Open MPI, openssh; NCCL with --nccl); root only
#   --no-cache          rebuild Horovod even when a cached wheel matches
#   --check             only report what is installed; change nothing
#
# Environment:
#   HOROVOD_BUILD_LOCK  a file to flock(1) around the compile (shared machines)
#   HOROVOD_WHEEL_CACHE where built wheels are kept
#                       (default: ~/.cache/horovod-operator/wheels)
#   MAKEFLAGS           passed to the build (default: -j<number of cores>)
#
# Gloo is always built. MPI is built when Open MPI's mpicxx is on PATH. The
# built wheel is cached under a key made of every version, the build options
# and the patch's hash, so a second run only reinstalls it (seconds).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PATCH_FILE="$ROOT/hack/patches/horovod-0.28.1.patch"

log() { printf '[install-worker] %s\n' "$*" >&2; }
die() { printf '[install-worker] error: %s\n' "$*" >&2; exit 1; }

PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
WITH_NCCL=0
FRAMEWORKS="pytorch,tensorflow"
USE_CACHE=1
CHECK_ONLY=0
WITH_APT=0
while (($#)); do
    case "$1" in
        --python) PYTHON="${2:?--python needs a path}"; shift 2 ;;
        --python=*) PYTHON="${1#*=}"; shift ;;
        --nccl) WITH_NCCL=1; shift ;;
        --frameworks) FRAMEWORKS="${2:?--frameworks needs a list}"; shift 2 ;;
        --frameworks=*) FRAMEWORKS="${1#*=}"; shift ;;
        --no-cache) USE_CACHE=0; shift ;;
        --apt) WITH_APT=1; shift ;;
        --check) CHECK_ONLY=1; shift ;;
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

# ---- pinned versions -------------------------------------------------------
# shellcheck source=versions.env
source "$ROOT/hack/versions.env"
for var in HOROVOD_VERSION HOROVOD_SDIST_SHA256 TORCH_VERSION TENSORFLOW_VERSION \
           TF_KERAS_VERSION TENSORBOARD_VERSION SCIKIT_LEARN_VERSION NUMPY_VERSION; do
    [[ -n "${!var:-}" ]] || die "$var is missing from hack/versions.env"
done
[[ "$TF_KERAS_VERSION" == "$TENSORFLOW_VERSION" ]] ||
    die "TF_KERAS_VERSION ($TF_KERAS_VERSION) must equal TENSORFLOW_VERSION ($TENSORFLOW_VERSION)"

# ---- prerequisites ---------------------------------------------------------
if ((WITH_APT)); then
    apt_pkgs=(cmake build-essential patch openmpi-bin libopenmpi-dev openssh-server openssh-client)
    ((WITH_NCCL)) && apt_pkgs+=(libnccl2 libnccl-dev)
    ((EUID == 0)) || die "--apt needs root (apt-get install ${apt_pkgs[*]})"
    log "apt-get install ${apt_pkgs[*]}"
    APT_LOG="$(mktemp)"
    if ! { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
        --no-install-recommends "${apt_pkgs[@]}"; } >"$APT_LOG" 2>&1; then
        tail -n 20 "$APT_LOG" >&2
        die "apt-get could not install ${apt_pkgs[*]}"
    fi
    rm -f "$APT_LOG"
fi
[[ -x "$PYTHON" ]] || die "no Python at $PYTHON: create the venv first (python3 -m venv .venv) or pass --python"
"$PYTHON" -m pip --version >/dev/null 2>&1 || die "$PYTHON has no pip"
missing=()
for tool in cmake make g++ patch; do command -v "$tool" >/dev/null || missing+=("$tool"); done
((${#missing[@]} == 0)) ||
    die "missing build tools: ${missing[*]} (Debian: apt-get install cmake build-essential patch)"
[[ -f "$PATCH_FILE" ]] || die "patch file missing: $PATCH_FILE"

WITH_MPI=0
MPI_DESC="none"
if command -v mpicxx >/dev/null && command -v mpirun >/dev/null; then
    WITH_MPI=1
    # "mpirun (Open MPI) 4.1.4" -> "openmpi-4.1.4": part of the cache key.
    MPI_DESC="$(mpirun --version 2>/dev/null | head -n1 | sed -E 's/^mpirun \(([^)]*)\) /\1-/; s/[^A-Za-z0-9.-]+//g' | tr 'A-Z' 'a-z')"
else
    log "Open MPI not found (mpicxx): building Horovod without MPI (Gloo only)."
    log "  for MPI: apt-get install openmpi-bin libopenmpi-dev, then rerun"
fi
if ((WITH_NCCL)); then
    command -v nvcc >/dev/null || [[ -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ]] ||
        die "--nccl needs the CUDA toolkit (nvcc); set CUDA_HOME or use a CUDA devel image"
    nccl_h="$(find "${HOROVOD_NCCL_HOME:-/usr}/include" /usr/local/cuda/include -maxdepth 1 -name nccl.h 2>/dev/null | head -n1 || true)"
    [[ -n "$nccl_h" ]] || die "--nccl needs NCCL headers (nccl.h): apt-get install libnccl-dev or set HOROVOD_NCCL_HOME"
fi

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

# tensorflow-cpu here; in the GPU image the full build with its own CUDA 12
# libraries from pip ([and-cuda]), since torch brings CUDA 13 libraries.
TF_DIST="tensorflow-cpu"
TF_SPEC="tensorflow-cpu==$TENSORFLOW_VERSION"
if ((WITH_NCCL)); then
    TF_DIST="tensorflow"
    TF_SPEC="tensorflow[and-cuda]==$TENSORFLOW_VERSION"
fi

if ((CHECK_ONLY)); then
    for dist in torch "$TF_DIST" tf-keras scikit-learn numpy horovod; do
        printf '%-14s %s\n' "$dist" "$(pip_installed "$dist" || true)"
    done
    exit 0
fi

# ---- frameworks (wheels only: nothing here compiles) -------------------------
START=$SECONDS
pkgs=(
    "numpy==$NUMPY_VERSION" "scikit-learn==$SCIKIT_LEARN_VERSION"
    "tensorboard==$TENSORBOARD_VERSION"
    # Horovod's runtime and build dependencies (built with --no-build-isolation).
    cloudpickle psutil pyyaml packaging cffi "setuptools>=69" wheel
)
((WITH_TORCH)) && pkgs+=("torch==$TORCH_VERSION")
((WITH_TF)) && pkgs+=("$TF_SPEC")
log "installing frameworks into $("$PYTHON" -c 'import sys; print(sys.prefix)'): ${pkgs[*]}"
PIP_LOG="$(mktemp)"
# --only-binary: nothing here may compile (torch alone is several GB of wheels).
if ! "$PYTHON" -m pip install --only-binary=:all: --progress-bar off "${pkgs[@]}" >"$PIP_LOG" 2>&1; then
    tail -n 20 "$PIP_LOG" >&2
    die "pip could not install the frameworks (log above)"
fi
grep '^Successfully installed' "$PIP_LOG" >&2 || log "already installed"
rm -f "$PIP_LOG"
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
log "frameworks ready ($((SECONDS - START)) s)"

# ---- Horovod: cached wheel or patched build ----------------------------------
PYTAG="$("$PYTHON" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')"
PATCH_SHA="$(sha256sum "$PATCH_FILE" | cut -c1-12)"
KEY="horovod-$HOROVOD_VERSION-$PYTAG"
((WITH_TORCH)) && KEY+="-torch$TORCH_VERSION"
((WITH_TF)) && KEY+="-tf$TENSORFLOW_VERSION"
((WITH_MPI)) && KEY+="-mpi-$MPI_DESC"
((WITH_NCCL)) && KEY+="-nccl"
KEY+="-patch$PATCH_SHA"
CACHE_ROOT="${HOROVOD_WHEEL_CACHE:-$HOME/.cache/horovod-operator/wheels}"
CACHE_DIR="$CACHE_ROOT/$KEY"
STAMP="$("$PYTHON" -c 'import sys; print(sys.prefix)')/.horovod-build-key"

if ((USE_CACHE)) && [[ -f "$STAMP" && "$(cat "$STAMP")" == "$KEY" ]] &&
    [[ "$(pip_installed horovod)" == "$HOROVOD_VERSION" ]]; then
    log "horovod $HOROVOD_VERSION already installed for $KEY"
else
    wheel="$(find "$CACHE_DIR" -maxdepth 1 -name 'horovod-*.whl' 2>/dev/null | head -n1 || true)"
    if ((USE_CACHE)) && [[ -n "$wheel" ]]; then
        log "using cached wheel $wheel"
    else
        SDIST_DIR="$CACHE_ROOT/sdist"
        SDIST="$SDIST_DIR/horovod-$HOROVOD_VERSION.tar.gz"
        mkdir -p "$SDIST_DIR"
        if [[ ! -f "$SDIST" ]]; then
            log "downloading the horovod $HOROVOD_VERSION sdist"
            "$PYTHON" -m pip download -q --no-deps --no-binary=:all: --no-build-isolation \
                -d "$SDIST_DIR" "horovod==$HOROVOD_VERSION" ||
                die "could not download horovod==$HOROVOD_VERSION from the package index"
        fi
        echo "$HOROVOD_SDIST_SHA256  $SDIST" | sha256sum -c --quiet - ||
            die "$SDIST does not match HOROVOD_SDIST_SHA256; delete it and rerun"

        WORK="$(mktemp -d)"
        trap 'rm -rf "$WORK"' EXIT
        tar -xzf "$SDIST" -C "$WORK"
        SRC="$WORK/horovod-$HOROVOD_VERSION"
        log "applying $(basename "$PATCH_FILE")"
        patch -p1 -s -d "$SRC" <"$PATCH_FILE" || die "the patch does not apply to horovod $HOROVOD_VERSION"

        export HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MXNET=1
        if ((WITH_TORCH)); then export HOROVOD_WITH_PYTORCH=1; else export HOROVOD_WITHOUT_PYTORCH=1; fi
        if ((WITH_TF)); then export HOROVOD_WITH_TENSORFLOW=1; else export HOROVOD_WITHOUT_TENSORFLOW=1; fi
        if ((WITH_MPI)); then export HOROVOD_WITH_MPI=1; else export HOROVOD_WITHOUT_MPI=1; fi
        if ((WITH_NCCL)); then
            export HOROVOD_GPU_OPERATIONS=NCCL
            export HOROVOD_CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
        fi
        export MAKEFLAGS="${MAKEFLAGS:--j$(nproc)}"
        # The compile must see the installed torch/TensorFlow, hence no isolation.
        build=("$PYTHON" -m pip wheel --no-deps --no-build-isolation --no-cache-dir -v -w "$WORK/dist" "$SRC")
        if [[ -n "${HOROVOD_BUILD_LOCK:-}" ]]; then
            log "waiting for the build lock $HOROVOD_BUILD_LOCK"
            exec {lock_fd}>>"$HOROVOD_BUILD_LOCK"
            flock "$lock_fd"
        fi
        BUILD_LOG="$WORK/build.log"
        log "building horovod $HOROVOD_VERSION (torch=$WITH_TORCH tensorflow=$WITH_TF gloo=1 mpi=$WITH_MPI nccl=$WITH_NCCL, $MAKEFLAGS); minutes"
        BUILD_START=$SECONDS
        if ! "${build[@]}" >"$BUILD_LOG" 2>&1; then
            grep -E 'error|Error|ERROR' "$BUILD_LOG" | tail -n 20 >&2 || true
            cp "$BUILD_LOG" "${TMPDIR:-/tmp}/horovod-build.log"
            die "the horovod build failed; full log: ${TMPDIR:-/tmp}/horovod-build.log"
        fi
        [[ -n "${lock_fd:-}" ]] && exec {lock_fd}>&-
        log "built in $((SECONDS - BUILD_START)) s"
        mkdir -p "$CACHE_DIR"
        cp "$WORK"/dist/horovod-*.whl "$CACHE_DIR/"
        wheel="$(find "$CACHE_DIR" -maxdepth 1 -name 'horovod-*.whl' | head -n1)"
        log "cached $wheel"
    fi
    # --no-deps: the dependencies are installed above, pinned.
    "$PYTHON" -m pip install --no-deps --force-reinstall --progress-bar off -q "$wheel"
    echo "$KEY" >"$STAMP"
fi

# ---- verify -------------------------------------------------------------------
HOROVODRUN="$(dirname "$PYTHON")/horovodrun"
[[ -x "$HOROVODRUN" ]] || die "horovodrun missing next to $PYTHON"
# --check-build loads each framework's extension; a tick means it loaded.
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}" TF_USE_LEGACY_KERAS=1
CHECK="$("$HOROVODRUN" --check-build 2>/dev/null)" || die "horovodrun --check-build failed"
printf '%s\n' "$CHECK" >&2
expect=("Gloo")
((WITH_TORCH)) && expect+=("PyTorch")
((WITH_TF)) && expect+=("TensorFlow")
((WITH_MPI)) && expect+=("MPI")
((WITH_NCCL)) && expect+=("NCCL")
for feature in "${expect[@]}"; do
    grep -qE "^\s*\[X\] $feature\s*$" <<<"$CHECK" ||
        die "horovod was built without $feature or cannot load it (see the check above)"
done
log "done in $((SECONDS - START)) s"
