#!/usr/bin/env bash
# The GPU check (docs/GPU.md in ../shared): on a machine with NVIDIA GPUs, Python
# with a CUDA build of torch from PyPI (its nvidia-* wheels), CMake and a C++
# compiler, and neither network nor Docker, prove Horovod's GPU path in one
# unattended run:
#
#   1. build the patched Horovod from the sdist that travels with the repository
#      (hack/install-worker.sh --cuda-from-wheels: NCCL from torch's nvidia-nccl
#      wheel, Gloo, no MPI) into a venv over the machine's Python; time it;
#   2. run the PyTorch trainer under horovodrun -np <GPUs> (Horovod timeline on):
#      every rank on gpu:<local_rank>, identical parameters, NCCL_ALLREDUCE in
#      the timeline;
#   3. run the probe (python -m horovod_worker.gpu_check probe) under horovodrun:
#      cuda:<local_rank> pinned, model and batch there, an allreduce of CUDA
#      tensors through NCCL, a training step timed with and without Horovod's
#      wrapper (median of runs); with 2+ GPUs scaling efficiency and bus bandwidth;
#   4. print one JSON summary line (also $OUT/summary.json); logs in $OUT.
#
#   hack/gpu-check.sh [--out DIR] [--python PATH] [--bundle DIR] [--np N]
#                     [--cc LIST] [--epochs N] [--build-only]
#   hack/gpu-check.sh bundle [DIR]
#
#   --out DIR      where everything goes [$OUT, else .work/gpu-check/out]
#   --python PATH  the machine's Python with CUDA torch [python3]
#   --bundle DIR   what `bundle` made: the sdist and wheels to install offline
#                  [.work/gpu-check/bundle]
#   --np N         ranks [every GPU torch sees]
#   --cc LIST      compute capabilities to build for [the first GPU's]
#   --epochs N     the trainer's epochs [3]
#   --build-only   step 1 only, and no GPU needed (with --cc): proves on any machine
#                  with the same Python and torch that the bundle builds offline
#   bundle [DIR]   here, with network: what the check installs offline, into DIR
#                  [.work/gpu-check/bundle]: the Horovod sdist (SHA-256 checked),
#                  nvcc as a CUDA toolkit folder made from PyPI's wheels at torch's
#                  CUDA minor (cuda-13.x.tar.xz) and Horovod's dependencies as
#                  wheels; carry DIR with the repository
#
# nvcc: a CUDA toolkit on the machine when its major is torch's (nvcc on PATH,
# $CUDA_HOME, /usr/local/cuda), else the bundle's. The exit status is 0 when
# every check passed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
say() { printf '[gpu-check] %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

# ---- bundle (on a machine with network) ---------------------------------------------
# The sdist; nvcc as a CUDA toolkit folder (NVIDIA's layout: bin, nvvm, include)
# made from PyPI's wheels at torch's CUDA minor and packed as cuda-<minor>.tar.xz
# (libnvvm, for run-time compilation only, left out); Horovod's dependencies as
# wheels for the Pythons a GPU machine may have.
bundle() {
    local dir="${1:-$ROOT/.work/gpu-check/bundle}"
    local python="${PYTHON:-$ROOT/.venv/bin/python}"
    mkdir -p "$dir/wheels"
    dir="$(cd "$dir" && pwd)"
    # shellcheck source=versions.env
    source "$ROOT/hack/versions.env"
    local sdist="$dir/horovod-$HOROVOD_VERSION.tar.gz"
    if [[ ! -f "$sdist" ]]; then
        local cached="${HOROVOD_WHEEL_CACHE:-$HOME/.cache/horovod-operator/wheels}/sdist/horovod-$HOROVOD_VERSION.tar.gz"
        if [[ -f "$cached" ]]; then
            cp "$cached" "$sdist"
        else
            "$python" -m pip download -q --no-deps --no-binary=:all: --no-build-isolation \
                -d "$dir" "horovod==$HOROVOD_VERSION"
        fi
    fi
    echo "$HOROVOD_SDIST_SHA256  $sdist" | sha256sum -c --quiet - || die "$sdist does not match HOROVOD_SDIST_SHA256"
    local cuda="${CUDA_MINOR:-}"
    if [[ -z "$cuda" ]]; then
        cuda="$("$python" -c 'import torch; print(torch.version.cuda or "")' 2>/dev/null || true)"
    fi
    [[ "$cuda" =~ ^13\.[0-9]+$ ]] || die "torch's CUDA is '${cuda:-none}' here: set CUDA_MINOR=13.x (PyPI has nvcc for CUDA 13 only)"
    local scratch
    scratch="$(mktemp -d)"
    trap 'rm -rf "$scratch"' RETURN
    "$python" -m pip install -q --no-deps --only-binary=:all: --target "$scratch/wheels" \
        "nvidia-cuda-nvcc==$cuda.*" "nvidia-nvvm==$cuda.*" "nvidia-cuda-crt==$cuda.*" \
        "nvidia-cuda-cccl==$cuda.*" "nvidia-cuda-runtime==$cuda.*"
    local top="$scratch/wheels/nvidia/cu${cuda%%.*}" kit="$scratch/cuda-$cuda"
    mkdir -p "$kit/nvvm"
    cp -a "$top/bin" "$top/include" "$kit/"
    cp -a "$top/nvvm/bin" "$top/nvvm/libdevice" "$kit/nvvm/"
    tar -C "$scratch" -cJf "$dir/cuda-$cuda.tar.xz" "cuda-$cuda"
    "$python" -m pip download -q --no-deps --only-binary=:all: -d "$dir/wheels" cloudpickle packaging pycparser
    # psutil, PyYAML and cffi (Horovod's setup_requires: without its wheel the offline
    # build stops before compiling) are compiled: one wheel per Python the GPU machine may have.
    local py
    for py in 3.10 3.11 3.12 3.13; do
        "$python" -m pip download -q --no-deps --only-binary=:all: -d "$dir/wheels" \
            --python-version "$py" --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
            psutil pyyaml cffi
    done
    say "bundle ready in $dir ($(du -sh "$dir" | cut -f1)): carry it with the repository"
}

if [[ "${1:-}" == bundle ]]; then
    shift
    bundle "$@"
    exit 0
fi

OUT_DIR="${OUT:-$ROOT/.work/gpu-check/out}"
PYTHON="python3"
BUNDLE="$ROOT/.work/gpu-check/bundle"
NP=""
CUDA_CC=""  # not CC: an exported CC (the C compiler) would take its value
EPOCHS=3
BUILD_ONLY=0
while (($#)); do
    case "$1" in
        --out) OUT_DIR="${2:?--out needs a folder}"; shift 2 ;;
        --python) PYTHON="${2:?--python needs a path}"; shift 2 ;;
        --bundle) BUNDLE="${2:?--bundle needs a folder}"; shift 2 ;;
        --np) NP="${2:?--np needs a number}"; shift 2 ;;
        --cc) CUDA_CC="${2:?--cc needs a list}"; shift 2 ;;
        --epochs) EPOCHS="${2:?--epochs needs a number}"; shift 2 ;;
        --build-only) BUILD_ONLY=1; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument: $1 (see --help)" ;;
    esac
done
[[ -z "$NP" || "$NP" =~ ^[1-9][0-9]*$ ]] || die "--np '$NP' is not a positive number"
[[ -z "$CUDA_CC" || "$CUDA_CC" =~ ^[0-9]+(,[0-9]+)*$ ]] || die "--cc '$CUDA_CC' is not a list like 90 or 80,90"
[[ "$EPOCHS" =~ ^[1-9][0-9]*$ ]] || die "--epochs '$EPOCHS' is not a positive number"
command -v "$PYTHON" >/dev/null || die "no Python '$PYTHON' (pass --python)"

mkdir -p "$OUT_DIR"
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
exec > >(tee -a "$OUT_DIR/gpu-check.log") 2>&1
say "output in $OUT_DIR"
export PYTHONPATH="$ROOT/worker:$ROOT/contract${PYTHONPATH:+:$PYTHONPATH}"

# ---- 0. the machine --------------------------------------------------------------------
nvidia-smi >"$OUT_DIR/nvidia-smi.txt" 2>&1 || say "nvidia-smi failed (see nvidia-smi.txt)"
"$PYTHON" - "$BUILD_ONLY" >"$OUT_DIR/machine.json" <<'EOF' || die "torch with CUDA is not usable here (see machine.json)"
import json, sys, torch
gpus = torch.cuda.device_count()
print(json.dumps({
    "python": sys.version.split()[0], "torch": torch.__version__, "cuda": torch.version.cuda,
    "gpus": gpus, "names": [torch.cuda.get_device_name(i) for i in range(gpus)],
    "capabilities": ["%d%d" % torch.cuda.get_device_capability(i) for i in range(gpus)],
}))
sys.exit(0 if torch.version.cuda and (gpus or sys.argv[1] == "1") else 1)
EOF
cat "$OUT_DIR/machine.json"
read -r GPUS FIRST_CC TORCH_CUDA < <("$PYTHON" -c 'import json,sys; m=json.load(open(sys.argv[1])); print(m["gpus"], (m["capabilities"] or ["none"])[0], m["cuda"])' "$OUT_DIR/machine.json")
NP="${NP:-$GPUS}"
((NP <= GPUS || BUILD_ONLY)) || die "--np $NP but torch sees $GPUS GPU(s)"
[[ -n "$CUDA_CC" || "$FIRST_CC" != none ]] || die "no GPU to take the compute capability from: pass --cc"
CUDA_CC="${CUDA_CC:-$FIRST_CC}"

# ---- 1. build ----------------------------------------------------------------------------
WORK="$OUT_DIR/work"
VENV="$WORK/venv"
rm -rf "$WORK"
mkdir -p "$WORK/wheels/sdist"
# A venv of its own that sees the machine's packages (torch and its nvidia-*
# wheels) through a .pth file: Horovod goes into it, not into the machine's
# Python. (--system-site-packages would not do when that Python is a venv.)
"$PYTHON" -m venv "$VENV"
# site.addsitedir, not a bare path: it also runs that folder's own .pth files
# (setuptools' distutils shim, which Horovod's CMake needs on Python 3.12+).
"$PYTHON" -c 'import site; print("\n".join(f"import site; site.addsitedir({p!r})" for p in site.getsitepackages() if p))' \
    >"$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/gpu-check-base.pth"
# Python.h where the machine's Python keeps it (Horovod's CMake may not find it).
py_include="$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')"
if [[ -f "$py_include/Python.h" ]]; then
    export CPLUS_INCLUDE_PATH="$py_include${CPLUS_INCLUDE_PATH:+:$CPLUS_INCLUDE_PATH}"
else
    say "no Python.h under $py_include: Horovod's torch extension needs the Python headers (python3-dev)"
fi
if [[ -d "$BUNDLE/wheels" ]]; then
    export PIP_NO_INDEX=1 PIP_FIND_LINKS="$BUNDLE/wheels"
    say "installing offline from $BUNDLE/wheels"
fi
cp "$BUNDLE"/horovod-*.tar.gz "$WORK/wheels/sdist/" 2>/dev/null ||
    say "no sdist in $BUNDLE: hack/install-worker.sh will try to download it"
"$VENV/bin/python" -m pip install -q cloudpickle psutil pyyaml packaging cffi >"$OUT_DIR/pip.log" 2>&1 ||
    say "could not install Horovod's dependencies (see pip.log); the build may still work"

build_args=(--python "$VENV/bin/python" --frameworks pytorch --skip-frameworks --cuda-from-wheels
    --without-mpi --cuda-cc-list "$CUDA_CC" --no-cache)
toolkit=""
if compgen -G "$BUNDLE/cuda-*.tar.xz" >/dev/null; then
    # The bundle's nvcc (a toolkit folder made from PyPI's wheels): used unless the
    # machine has its own toolkit of torch's CUDA major (below).
    for kit in "$BUNDLE"/cuda-*.tar.xz; do tar -C "$WORK" -xJf "$kit"; done
fi
for candidate in "$(dirname "$(dirname "$(command -v nvcc 2>/dev/null || echo /nonexistent/bin/nvcc)")")" \
    "${CUDA_HOME:-}" /usr/local/cuda; do
    [[ -n "$candidate" && -x "$candidate/bin/nvcc" && -d "$candidate/nvvm" ]] || continue
    release="$("$candidate/bin/nvcc" --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p')"
    if [[ "$release" == "${TORCH_CUDA%%.*}" ]]; then toolkit="$candidate"; break; fi
    say "nvcc in $candidate is CUDA $release, torch's is $TORCH_CUDA: not used"
done
if [[ -z "$toolkit" ]]; then
    for candidate in "$WORK"/cuda-*; do [[ -x "$candidate/bin/nvcc" ]] && toolkit="$candidate"; done
fi
[[ -n "$toolkit" ]] && build_args+=(--cuda-compiler "$toolkit")
say "building Horovod: hack/install-worker.sh ${build_args[*]}"
export HOROVOD_WHEEL_CACHE="$WORK/wheels"
# CMake 4 (pip's cmake, as on the H200 machine) refuses Gloo's cmake_minimum_required(2.8);
# CMake 3.x ignores this.
export CMAKE_POLICY_VERSION_MINIMUM="${CMAKE_POLICY_VERSION_MINIMUM:-3.5}"
# GCC 13 (the H200 machine's) no longer pulls <string> and <stdexcept> in through other
# headers, and Horovod 0.28.1's group_table.h and common.h rely on it; the images'
# Debian GCC 12 does. Force-included here rather than in the images' patch.
export CXXFLAGS="${CXXFLAGS:+$CXXFLAGS }-include string -include stdexcept"
"$ROOT/hack/install-worker.sh" "${build_args[@]}" --print-env >"$OUT_DIR/build-env.txt" 2>&1 || true
start=$SECONDS
rc=0
"$ROOT/hack/install-worker.sh" "${build_args[@]}" >"$OUT_DIR/build.log" 2>&1 || rc=$?
build_seconds=$((SECONDS - start))
cp "${TMPDIR:-/tmp}/horovod-build.log" "$OUT_DIR/horovod-build.log" 2>/dev/null || true
"$PYTHON" - "$OUT_DIR/build.json" "$rc" "$build_seconds" "$CUDA_CC" "${toolkit:-pypi}" <<'EOF'
import json, sys
out, rc, seconds, cc, compiler = sys.argv[1:]
json.dump({"rc": int(rc), "seconds": int(seconds), "cc_list": cc, "nvcc": compiler}, open(out, "w"))
EOF
say "build exit $rc in ${build_seconds}s (build.log)"
if ((BUILD_ONLY)); then
    cat "$OUT_DIR/build.json"
    tail -n 16 "$OUT_DIR/build.log"
    exit "$rc"
fi

# ---- 2. the trainer, 3. the probe ------------------------------------------------------------
if ((rc == 0)); then
    HOROVODRUN="$VENV/bin/horovodrun"
    say "trainer: horovodrun -np $NP"
    HOROVOD_TIMELINE="$OUT_DIR/trainer-timeline.json" NCCL_DEBUG=INFO HVJOB_EXPECTED_SIZE="$NP" \
        timeout 900 "$HOROVODRUN" -np "$NP" -H "localhost:$NP" --gloo \
        "$VENV/bin/python" -m horovod_worker.train --framework pytorch --dataset digits \
        --epochs "$EPOCHS" >"$OUT_DIR/trainer.log" 2>&1 || say "the trainer failed (trainer.log)"
    say "probe: horovodrun -np $NP"
    HOROVOD_TIMELINE="$OUT_DIR/probe-timeline.json" NCCL_DEBUG=INFO \
        timeout 900 "$HOROVODRUN" -np "$NP" -H "localhost:$NP" --gloo \
        "$VENV/bin/python" -m horovod_worker.gpu_check probe --out "$OUT_DIR" \
        >"$OUT_DIR/probe.log" 2>&1 || say "the probe failed (probe.log)"
fi

# ---- 4. one JSON line ----------------------------------------------------------------------------
"$VENV/bin/python" -m horovod_worker.gpu_check summarize --out "$OUT_DIR" --gpus "$NP"
