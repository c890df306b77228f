#!/usr/bin/env bash
# The whole thing in one command: a HorovodJob from `kubectl apply` to Succeeded.
#
#   hack/demo.sh                   PyTorch example (examples/pytorch-digits.yaml)
#   hack/demo.sh --tensorflow      TensorFlow example (examples/tensorflow-digits.yaml)
#   hack/demo.sh --kubeconfig K    use that cluster (also when KUBECONFIG is set); it asks
#                                  before changing it, or --yes says go ahead
#   hack/demo.sh --skip-install    do not run hack/bootstrap.sh (all is installed already)
#
# Without a cluster it installs what is needed (hack/bootstrap.sh), starts the
# local control plane (hack/cluster.sh) and the node agent (hack/nodeagent.sh),
# which runs every pod as local processes in their own network namespaces, so
# the launcher really reaches the workers over ssh. Then it installs the CRD,
# starts the operator, applies the example, streams the launcher's training
# progress and prints the job's status table and final accuracy. Everything it
# started is stopped and removed on exit. Needs root (network namespaces).
# With a cluster of yours, the worker image (see Dockerfile.worker) must be
# available to it; the operator runs on this machine against that cluster.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

framework=pytorch
kubeconfig="${KUBECONFIG:-}"
skip_install=0
assume_yes=0
while (($#)); do
  case "$1" in
    --tensorflow) framework=tensorflow ;;
    --pytorch) framework=pytorch ;;
    --kubeconfig) kubeconfig="$2"; shift ;;
    --kubeconfig=*) kubeconfig="${1#*=}" ;;
    --skip-install) skip_install=1 ;;
    --yes|-y) assume_yes=1 ;;
    -h|--help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

say() { printf '\033[1m[demo]\033[0m %s\n' "$*" >&2; }
work="$repo/.work/demo"
cluster_dir="$work/cluster"
agent_dir="$work/nodeagent"
job="$framework-digits"
example="examples/$job.yaml"
local_cluster=0
[[ -z "$kubeconfig" ]] && local_cluster=1
operator_pid="" agent_pid=""
# Set once the user's cluster may be changed (it asked, or --yes): only then is
# anything there cleaned up.
consented=0

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  say "cleaning up"
  if [[ -n "$operator_pid" ]]; then
    kill -TERM "$operator_pid" 2>/dev/null || true
    wait "$operator_pid" 2>/dev/null || true
  fi
  if ((local_cluster)); then
    if [[ -n "$agent_pid" ]]; then
      kill -TERM "$agent_pid" 2>/dev/null || true
      wait "$agent_pid" 2>/dev/null || true
    fi
    hack/cluster.sh down --dir "$cluster_dir" >/dev/null 2>&1 || true
    say "logs of this run: $work/*.log"
  elif ((consented)); then
    kubectl delete hj "$job" --ignore-not-found --wait=false >/dev/null 2>&1 || true
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

mkdir -p "$work"
if ((local_cluster)); then
  if [[ $(id -u) -ne 0 ]]; then
    say "the local demo needs root: its node agent creates network namespaces. Fix: sudo $0 $*"
    exit 1
  fi
  if ((!skip_install)); then
    say "installing what is needed (hack/bootstrap.sh; cached after the first run)"
    hack/bootstrap.sh
  fi
  say "building CoreDNS for the pods' cluster DNS (cached)"
  hack/nodeagent.sh build >/dev/null
  say "starting the local control plane ($cluster_dir)"
  hack/cluster.sh down --dir "$cluster_dir" >/dev/null 2>&1 || true
  hack/cluster.sh up --dir "$cluster_dir" --port-base "${DEMO_PORT_BASE:-16800}"
  export KUBECONFIG="$cluster_dir/kubeconfig"
  export PATH="$cluster_dir/bin:$PATH"
  # kwok's fake GPU nodes would take the pods and never run them: the agent's
  # nodes are the only ones here, so they need no taint and the example runs as is.
  kubectl delete nodes -l horovod.ai/node-kind=kwok --wait=true >/dev/null
  say "starting the node agent (nodes local-0 and local-1; log: $work/nodeagent.log)"
  rm -f "$work/agent-ready.json"
  hack/nodeagent.sh --state-dir "$agent_dir" run --kubeconfig "$KUBECONFIG" \
    --no-taint --ready-file "$work/agent-ready.json" >"$work/nodeagent.log" 2>&1 &
  agent_pid=$!
  for _ in $(seq 600); do
    [[ -f "$work/agent-ready.json" ]] && break
    if ! kill -0 "$agent_pid" 2>/dev/null; then
      tail -20 "$work/nodeagent.log" >&2
      say "the node agent did not start (see above)"
      exit 1
    fi
    sleep 0.5
  done
  [[ -f "$work/agent-ready.json" ]] || { say "the node agent did not become ready"; exit 1; }
else
  export KUBECONFIG="$kubeconfig"
  say "using the cluster of $KUBECONFIG (nothing local is started)"
  ((skip_install)) || SKIP_WORKER=1 hack/bootstrap.sh
  if ! command -v kubectl >/dev/null; then
    export PATH="$(dirname "$(PYTHONPATH="$repo" python3 -c 'from localcluster import gobuild; print(gobuild.ensure("kubectl"))')"):$PATH"
  fi
  # Someone else's cluster: say what will change there, and change it only when told to.
  context="$(kubectl config current-context 2>/dev/null || echo '?')"
  ns="$(kubectl config view --minify -o jsonpath='{..namespace}' 2>/dev/null || true)"
  ns="${ns:-default}"
  say "in context $context this demo will: apply the HorovodJob CRD (cluster-wide), run an operator"
  say "here that watches namespace $ns only, and delete then re-create HorovodJob $job in $ns"
  if ((!assume_yes)); then
    if [[ -t 0 ]]; then
      read -r -p "[demo] go ahead? [y/N] " answer
      [[ "$answer" == y || "$answer" == Y || "$answer" == yes ]] || { say "nothing changed"; exit 1; }
    else
      say "not a terminal to ask in: nothing changed. Fix: hack/demo.sh --kubeconfig $KUBECONFIG --yes"
      exit 2
    fi
  fi
  consented=1
fi
namespace_args=()
((local_cluster)) || namespace_args=(--namespace "$ns")

say "installing the HorovodJob CRD"
kubectl apply -f crds/ >/dev/null
# Polled: `kubectl wait` fails at once, not after its timeout, while the API server
# has not yet written the new CRD's conditions (localcluster/crds.py).
for _ in $(seq 120); do
  established="$(kubectl get crd horovodjobs.horovod.ai \
    -o jsonpath='{.status.conditions[?(@.type=="Established")].status}' 2>/dev/null || true)"
  [[ "$established" == True ]] && break
  sleep 0.5
done
[[ "$established" == True ]] || { say "the HorovodJob CRD was not Established within 60 s"; exit 1; }

say "starting the operator (log: $work/operator.log)"
# The chart's default worker image, as `helm install` would set it (the example
# leaves spec.image to it; the local node agent ignores images).
default_image="$(sed -n 's/^workerImage: *//p' charts/horovod-operator/values.yaml)"
.venv/bin/python -m horovod_operator --kubeconfig "$KUBECONFIG" --http-port 0 "${namespace_args[@]}" \
  --default-image "$default_image" \
  >"$work/operator.log" 2>&1 &
operator_pid=$!

kubectl delete hj "$job" --ignore-not-found --wait=true >/dev/null
say "kubectl apply -f $example"
kubectl apply -f "$example"

phase() { kubectl get hj "$job" -o jsonpath='{.status.phase}' 2>/dev/null || true; }
say "waiting for the workers and the launcher; streaming its log"
streamed=""
while true; do
  p="$(phase)"
  pod="$(kubectl get pods -l "job-name=$job-launcher" --sort-by=.metadata.creationTimestamp \
    -o jsonpath='{.items[-1:].metadata.name}' 2>/dev/null || true)"
  if [[ -n "$pod" && "$pod" != "$streamed" ]] \
    && kubectl logs -f "$pod" 2>/dev/null; then
    streamed="$pod"
  fi
  [[ "$p" == Succeeded || "$p" == Failed ]] && break
  if ! kill -0 "$operator_pid" 2>/dev/null; then
    tail -20 "$work/operator.log" >&2
    say "the operator exited (see above)"
    exit 1
  fi
  sleep 1
done

echo
kubectl get hj "$job"
result="$(kubectl logs "${streamed:-job/$job-launcher}" 2>/dev/null | grep -o 'HVJOB_RESULT .*' | tail -1 || true)"
if [[ -n "$result" ]]; then
  accuracy="$(printf '%s' "${result#HVJOB_RESULT }" \
    | python3 -c 'import json, sys; print("%.4f" % json.load(sys.stdin)["test_accuracy"])')"
  say "final test accuracy: $accuracy"
fi
[[ "$(phase)" == Succeeded ]]
