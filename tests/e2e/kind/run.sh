#!/usr/bin/env bash
# kind end-to-end: a real cluster in Docker, both images built and loaded, the
# chart installed, every example run (CPU-only variants) to its expected phase.
#
# Needs a Docker host plus kind, kubectl, helm and python3 with PyYAML. It cannot
# run on machines without a Docker engine (our CI's); there, the chart, the
# manifests, the examples and kind_e2e.py are exercised against the local control
# plane by tests/operator/integration/test_chart.py and
# tests/tooling/integration/test_kind_helpers.py.
#
#   tests/e2e/kind/run.sh                      # KIND_NODE_IMAGE=kindest/node:v1.33.1 to pick a version
#   KEEP_CLUSTER=1 tests/e2e/kind/run.sh       # leave the cluster for debugging
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
cd "$repo"
for tool in docker kind kubectl helm python3; do
  command -v "$tool" >/dev/null || { echo "error: $tool is not installed (needed by the kind e2e)" >&2; exit 1; }
done
cluster="${KIND_CLUSTER:-horovod-e2e}"
tag="e2e-$(git rev-parse --short HEAD 2>/dev/null || echo local)"
helpers="python3 tests/e2e/kind/kind_e2e.py"

cleanup() {
  if [[ "${KEEP_CLUSTER:-0}" != 1 ]]; then kind delete cluster --name "$cluster" || true; fi
}
trap cleanup EXIT

echo "== kind cluster $cluster (${KIND_NODE_IMAGE:-the default node image of kind})"
kind create cluster --name "$cluster" ${KIND_NODE_IMAGE:+--image "$KIND_NODE_IMAGE"} --wait 180s

echo "== images"
# kind nodes have no GPUs: the CPU worker images (see docs/images.md).
DOCKER_BUILDKIT=1 docker build -f Dockerfile.operator -t "horovod-operator:$tag" .
for target in torch-cpu tf-cpu; do
  DOCKER_BUILDKIT=1 docker build -f Dockerfile.worker --target "$target" -t "horovod-worker:$tag-$target" .
done
kind load docker-image --name "$cluster" "horovod-operator:$tag" "horovod-worker:$tag-torch-cpu" "horovod-worker:$tag-tf-cpu"

echo "== chart"
helm install horovod-operator charts/horovod-operator --namespace horovod-system --create-namespace \
  --set image.repository=horovod-operator --set image.tag="$tag" --set image.pullPolicy=Never \
  --set workerImage="horovod-worker:$tag-torch-cpu" --wait --timeout 180s

failed=0
for example in examples/*.yaml; do
  name="$(python3 -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))["metadata"]["name"])' "$example")"
  expect="$($helpers expected "$example")"
  echo "== $example: $name, expecting $expect"
  case "$(basename "$example")" in
    tensorflow-*) image="horovod-worker:$tag-tf-cpu" ;;
    *) image="horovod-worker:$tag-torch-cpu" ;;
  esac
  $helpers cpu-variant "$example" --image "$image" | kubectl apply -n default -f -
  if ! $helpers wait "$name" --namespace default --expect "$expect" --timeout "${JOB_TIMEOUT:-1200}"; then
    failed=1
  fi
done
exit "$failed"
