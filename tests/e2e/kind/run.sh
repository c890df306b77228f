#!/usr/bin/env bash
# kind end-to-end: a real cluster in Docker (kubelet, containerd, runc, CNI, cluster
# DNS), the operator image installed by the chart and reconciling through its
# ServiceAccount, the worker images' sshd and horovodrun in real containers.
# Every example runs (CPU-only variant) to its expected phase, and one job that
# must fail reports the failure a user needs to see.
#
# Needs a Docker host plus kind, kubectl, helm and python3 with PyYAML.
#
#   tests/e2e/kind/run.sh                       # kind's default node image (pulled)
#   make kind-e2e                               # a node image built here, no registry
#                                               # (hack/kind.sh; docs/dev/kind-node-image.md)
# Environment:
#   KIND_NODE_IMAGE   node image [kind's default]     KIND_CONFIG   kind config file [none]
#   KIND_CLUSTER      cluster name [horovod-e2e]      KEEP_CLUSTER=1  leave it for debugging
#   E2E_ARTIFACTS     where logs, `kind export logs` and timings.json go [.work/kind-e2e]
#   JOB_TIMEOUT       seconds a job may take [420: the examples take 10-30 s here; a stuck
#                     one must not use up CI's time]
#   REALPODS_REPEATS  also time apply -> first step, ours and mpi-operator, N runs each
#                     (bench/realpods_kind.py) [unset: not run]
#   REALPODS_OUT      where those runs go [$E2E_ARTIFACTS/realpods-kind.json]
set -Eeuo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
cd "$repo"
for tool in docker kind kubectl helm python3; do
  command -v "$tool" >/dev/null || { echo "error: $tool is not installed (needed by the kind e2e)" >&2; exit 1; }
done
cluster="${KIND_CLUSTER:-horovod-e2e}"
artifacts="${E2E_ARTIFACTS:-$repo/.work/kind-e2e}"
mkdir -p "$artifacts"
rm -f "$artifacts/timings.json"
helpers="python3 tests/e2e/kind/kind_e2e.py"
version="$(hack/images.sh version)"
operator_image="horovod-operator:$version"
start=$SECONDS
failed=0
failed_jobs=()
current_step=""
failure=""
step() { current_step="$*"; echo "== [$((SECONDS - start))s] $*"; }
# The dump below is long: the command that stopped the run is repeated after it, as
# the last lines of the log, where CI's excerpt of it ends.
trap 'failure="line $LINENO: $BASH_COMMAND (exit $?) during: $current_step"' ERR
dump() {
  step "dumping what a user would look at into $artifacts"
  kubectl get pods -A -o wide || true
  kubectl logs -n horovod-system -l app.kubernetes.io/name=horovod-operator --all-containers \
    --prefix --tail=300 >"$artifacts/operator.log" 2>&1 || true
  tail -n 80 "$artifacts/operator.log" || true
  kubectl get events -A --sort-by=.lastTimestamp >"$artifacts/events.txt" 2>&1 || true
  tail -n 60 "$artifacts/events.txt" || true
  kind export logs --name "$cluster" "$artifacts/kind-logs" >/dev/null 2>&1 || true
  echo "kind's node logs (kubelet, containerd, pods): $artifacts/kind-logs"
}
cleanup() {
  local rc=$?
  if ((rc != 0 || failed != 0)); then dump; fi
  if [[ "${KEEP_CLUSTER:-0}" != 1 ]]; then kind delete cluster --name "$cluster" >/dev/null 2>&1 || true; fi
  if ((rc != 0)) && [[ -n "$failure" ]]; then echo "run.sh stopped at $failure" >&2; fi
  if ((failed != 0)); then echo "jobs that did not reach their expected phase: ${failed_jobs[*]}" >&2; fi
  echo "== [$((SECONDS - start))s] done (exit $rc)"
}
trap cleanup EXIT

step "kind cluster $cluster (${KIND_NODE_IMAGE:-the default node image of kind})"
kind delete cluster --name "$cluster" >/dev/null 2>&1 || true
kind create cluster --name "$cluster" ${KIND_NODE_IMAGE:+--image "$KIND_NODE_IMAGE"} \
  ${KIND_CONFIG:+--config "$KIND_CONFIG"} --wait 180s
kubectl config use-context "kind-$cluster" >/dev/null

step "images"
# kind nodes have no GPUs: the CPU worker images (see docs/images.md).
hack/images.sh operator
hack/images.sh worker torch-cpu tf-cpu
images=("$operator_image" "horovod-worker:$version-torch-cpu" "horovod-worker:$version-tf-cpu")
# Each image goes into every node's containerd straight from `docker save` (no archive
# on the disk) and keeps only its unpacked layers (ctr's --discard-unpacked-layers): at
# most one copy of each image, plus the layers of the one coming in. `kind
# load` keeps three at its peak (its archive, the content store, the snapshots); on a
# machine whose disk holds Docker's build cache too that was more than there was.
# A node whose ctr lacks the flag (an older node image) gets `kind load` instead.
load_image() {  # IMAGE
  local node snapshotter usage
  for node in $(kind get nodes --name "$cluster"); do
    usage="$(docker exec "$node" ctr images import --help 2>&1 || true)"
    if [[ "$usage" != *--discard-unpacked-layers* ]]; then
      echo "$node: its ctr cannot discard unpacked layers; kind load keeps them"
      kind load docker-image --name "$cluster" --nodes "$node" "$1"
      continue
    fi
    # The snapshotter the kubelet's CRI uses (kind asks the same way): an image unpacked
    # into another one would be pulled again, and its layers are gone.
    snapshotter="$(docker exec "$node" containerd config dump 2>/dev/null |
      sed -n 's/^ *snapshotter = "\(.\+\)"$/\1/p' | head -n 1)"
    docker save "$1" | docker exec -i "$node" ctr --namespace=k8s.io images import --local --digests \
      --snapshotter="${snapshotter:-overlayfs}" --discard-unpacked-layers -
    echo "$node: its containerd holds $(docker exec "$node" du -sm /var/lib/containerd | cut -f1) MB"
  done
}
# Largest first: while an image comes in, its layers and its snapshots are both on the
# disk (measured: 5.8 GB of content, then 6.1 GB unpacked, for the torch image); the
# layers go once it is unpacked. So the peak is the images in before it plus twice it.
mapfile -t sized < <(for image in "${images[@]}"; do
  printf '%s %s\n' "$(docker image inspect -f '{{.Size}}' "$image")" "$image"
done | sort -rn)
images=() bytes=0 peak=0
for line in "${sized[@]}"; do
  size="${line%% *}"
  images+=("${line#* }")
  if ((bytes + 2 * size > peak)); then peak=$((bytes + 2 * size)); fi
  bytes=$((bytes + size))
done
need_mb=$((peak / 1048576 + 2048))
root="$(docker info -f '{{.DockerRootDir}}' 2>/dev/null || echo /)"
free_mb="$(df -Pm "$root" | awk 'NR == 2 {print $4}')"
if ((free_mb < need_mb)); then
  echo "error: loading the images into kind needs about ${need_mb} MB free under $root; ${free_mb} MB are. Fix: hack/images.sh prune (what older builds left), then docker image prune" >&2
  exit 1
fi
echo "loading $((bytes / 1048576)) MB of images; ${free_mb} MB free under $root, about ${need_mb} MB needed"
for image in "${images[@]}"; do
  step "load $image into the nodes' containerd"
  load_image "$image"
done

step "chart"
helm install horovod-operator charts/horovod-operator --namespace horovod-system --create-namespace \
  --set image.repository=horovod-operator --set image.tag="$version" --set image.pullPolicy=Never \
  --set workerImage="horovod-worker:$version-torch-cpu" --wait --timeout 180s
$helpers operator-ready --namespace horovod-system --timeout 120

run_job() {  # MANIFEST NAME EXPECT [REASON]
  local manifest="$1" name="$2" expect="$3" reason="${4:-}"
  kubectl apply -n default -f "$manifest"
  rm -f "$artifacts/$name.rank-line"
  if $helpers wait "$name" --namespace default --expect "$expect" ${reason:+--reason "$reason"} \
      --timeout "${JOB_TIMEOUT:-420}" --rank-line "$artifacts/$name.rank-line"; then
    $helpers timings "$name" --namespace default --record "$artifacts/timings.json" \
      --rank-line "$artifacts/$name.rank-line"
  else
    failed=1
    failed_jobs+=("$name")
  fi
}

# kind's node image ships no volume provisioner: each claim of an example gets a
# hostPath PersistentVolume bound ahead, in a directory any uid may write (the
# worker images run as 1000; hostPath ignores fsGroup).
default_class="$(kubectl get storageclass -o jsonpath='{.items[?(@.metadata.annotations.storageclass\.kubernetes\.io/is-default-class=="true")].metadata.name}')"
for example in examples/*.yaml; do
  volumes="$($helpers volumes "$example" --class "$default_class")"
  [[ -n "$volumes" ]] || continue
  for path in $(grep -o '/var/local/hvjob-volumes/[^ ]*' <<<"$volumes"); do
    docker exec "$cluster-control-plane" mkdir -p -m 0777 "$path"
  done
  kubectl apply -f - <<<"$volumes"
done

for example in examples/*.yaml; do
  name="$($helpers name "$example")"
  expect="$($helpers expected "$example")"
  case "$(basename "$example")" in
    tensorflow-*) image="horovod-worker:$version-tf-cpu" ;;
    *) image="horovod-worker:$version-torch-cpu" ;;
  esac
  step "$example: $name on $image, expecting $expect"
  $helpers cpu-variant "$example" --image "$image" >"$artifacts/$name.yaml"
  run_job "$artifacts/$name.yaml" "$name" "$expect"
done

example=examples/pytorch-digits.yaml
step "a job that must fail: $example with an argument the trainer refuses"
name="$($helpers failing-name "$example")"
$helpers failing-variant "$example" --image "horovod-worker:$version-torch-cpu" >"$artifacts/$name.yaml"
run_job "$artifacts/$name.yaml" "$name" Failed LauncherFailed

if [[ -n "${REALPODS_REPEATS:-}" ]]; then
  # bench/realpods_kind.py: the same program under ours and under mpi-operator (a
  # process beside the cluster), apply -> first step -> Succeeded on this kubelet.
  step "real pods: ours and mpi-operator, ${REALPODS_REPEATS} run(s) each"
  kind get kubeconfig --name "$cluster" >"$artifacts/kubeconfig"
  if ! python3 -m bench.realpods_kind --kubeconfig "$artifacts/kubeconfig" \
      --image "horovod-worker:$version-torch-cpu" --repeats "$REALPODS_REPEATS" \
      --out "${REALPODS_OUT:-$artifacts/realpods-kind.json}" --logs "$artifacts/realpods-kind"; then
    failed=1
    failed_jobs+=("real pods (bench.realpods_kind)")
  fi
fi

step "timings (apply -> trainers started -> finished), also in $artifacts/timings.json"
cat "$artifacts/timings.json"
exit "$failed"
