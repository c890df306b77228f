"""Faults, against the real API server: disruptions, the failure policy, lost nodes,
a restarted and a hung API server, and two operator replicas with leader election."""

from __future__ import annotations

import json
import math
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from tests.support.cluster import KubeCluster
from tests.support.freezeproxy import FreezeProxy
from tests.support.operator import Jobs, Operator, hvjob


def _restarted(jobs: Jobs, name: str, restarts: int) -> Any:
    def check() -> dict[str, Any] | None:
        status = jobs.status(name)
        ok = status.get("restarts") == restarts and status.get("phase") == "Running"
        return status if ok else None

    return jobs.op.wait(check, 60, f"{name} running again after restart {restarts}")


def test_a_worker_deleted_by_hand_restarts_the_attempt_without_counting(
    jobs: Jobs, namespace: str, cluster: KubeCluster
) -> None:
    jobs.apply(hvjob("handled", replicas=2, runPolicy={"backoffLimit": 0}))
    jobs.wait_running("handled")
    cluster.kubectl("delete", "pod", "handled-worker-1", "-n", namespace, "--wait=false")
    status = _restarted(jobs, "handled", 1)
    assert status["uncountedRestarts"] == 1
    (failure,) = status["failures"]
    assert (failure["pod"], failure["reason"]) == ("handled-worker-1", "PodDeleted")
    messages = [m for r, m in jobs.warnings("handled") if r == "WorkerFailed"]
    assert any("not counted (0 of backoffLimit 0 used)" in m for m in messages), messages


def test_an_eviction_restarts_the_attempt_without_counting(
    jobs: Jobs, namespace: str, cluster: KubeCluster, tmp_path: Path
) -> None:
    jobs.apply(hvjob("evicted", replicas=2, runPolicy={"backoffLimit": 0}))
    jobs.wait_running("evicted")
    eviction = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": "evicted-worker-0", "namespace": namespace},
    }
    path = tmp_path / "eviction.json"
    path.write_text(json.dumps(eviction))
    cluster.kubectl(
        "create",
        "--raw",
        f"/api/v1/namespaces/{namespace}/pods/evicted-worker-0/eviction",
        "-f",
        str(path),
    )
    status = _restarted(jobs, "evicted", 1)
    assert status["uncountedRestarts"] == 1
    assert status["failures"][0]["pod"] == "evicted-worker-0"
    assert status["failures"][0]["reason"] in ("EvictionByEvictionAPI", "PodDeleted")


def test_a_fail_job_rule_ends_the_job_at_the_first_matching_exit_code(
    jobs: Jobs, namespace: str, cluster: KubeCluster
) -> None:
    rules = [{"action": "FailJob", "onExitCodes": {"operator": "In", "values": [42]}}]
    policy = {"backoffLimit": 3, "podFailurePolicy": {"rules": rules}}
    jobs.apply(hvjob("fatal", replicas=2, runPolicy=policy))
    jobs.wait_running("fatal")
    cluster.set_pod_phase(namespace, "fatal-worker-1", "Failed", exit_code=42)
    status = jobs.wait_phase("fatal", "Failed")
    assert (status["reason"], status["restarts"]) == ("PodFailurePolicy", 0)
    assert "pod fatal-worker-1 container worker failed (Error, exit code 42)" in status["message"]
    assert "podFailurePolicy rule 0 (FailJob)" in status["message"]


def test_a_pod_stuck_terminating_on_a_lost_node_is_force_deleted(
    jobs: Jobs, operator: Operator, namespace: str, cluster: KubeCluster, ghost_node: str
) -> None:
    operator.stop()
    operator.extra_args = ["--stuck-pod-grace", "2"]
    operator.start()
    manifest = hvjob("lost", replicas=1, runPolicy={"startupTimeoutSeconds": 600})
    manifest["spec"]["worker"]["template"] = {"spec": {"nodeName": ghost_node}}
    jobs.apply(manifest)
    first = jobs.op.wait(lambda: jobs.pods("lost"), 20, "the worker pod")[0]["metadata"]["uid"]
    # No kubelet answers for the node: the pod stays terminating.
    cluster.kubectl(
        "delete", "pod", "lost-worker-0", "-n", namespace, "--grace-period=1", "--wait=false"
    )
    warning = jobs.op.wait(
        lambda: [m for r, m in jobs.warnings("lost") if r == "ForceDeleted"], 30, "ForceDeleted"
    )
    assert f"node {ghost_node} not responding); force-deleted" in warning[0]
    assert "pod lost-worker-0 was still terminating" in warning[0]

    def replaced() -> bool:
        pods = jobs.pods("lost")
        return bool(pods) and pods[0]["metadata"]["uid"] != first

    jobs.op.wait(replaced, 20, "a new worker pod")


def test_a_job_completes_across_restarts_of_etcd_and_the_api_server(
    jobs: Jobs, namespace: str, cluster: KubeCluster
) -> None:
    jobs.apply(hvjob("steady", replicas=2))
    launcher = jobs.wait_running("steady")
    cluster.restart("etcd")
    cluster.restart("kube-apiserver")
    # The operator's watches reconnect: it sees the launcher finish and acts.
    cluster.set_pod_phase(namespace, launcher, "Succeeded")
    status = jobs.wait_phase("steady", "Succeeded", timeout=90)
    assert status["restarts"] == 0
    jobs.op.wait(lambda: jobs.pods("steady") == [], 60, "workers cleaned up")
    assert jobs.op.proc is not None and jobs.op.proc.poll() is None


def _healthz(op: Operator) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{op.port}/healthz", timeout=2) as r:
            return int(r.status)
    except urllib.error.HTTPError as error:
        return int(error.code)
    except OSError:
        return 0


# Seconds from the deadline's edit to its fall: the operator takes the edit and the
# test freezes the proxy within them, even on a loaded machine.
DEADLINE_AHEAD = 15


def test_healthz_turns_red_while_the_api_server_hangs(
    cluster: KubeCluster, namespace: str, crd: None, tmp_path: Path
) -> None:
    """The operator talks to the API server through a proxy that can stop forwarding
    (a half-open connection); a reconcile in flight then hangs and /healthz says so."""
    config = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    server = config["clusters"][0]["cluster"]["server"]
    proxy = FreezeProxy(int(server.rsplit(":", 1)[1]))
    config["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{proxy.port}"
    proxied = tmp_path / "proxied.kubeconfig"
    proxied.write_text(yaml.safe_dump(config))
    op = Operator(cluster, namespace, tmp_path / "operator.log")
    op.kubeconfig = proxied
    op.extra_args = ["--stall-seconds", "3"]
    op.start()
    try:
        jobs = Jobs(cluster, namespace, op)
        jobs.apply(hvjob("hung", replicas=1))
        jobs.wait_running("hung", timeout=30)
        op.wait(lambda: _healthz(op) == 200, 10, "a green probe")
        # The deadline is the only thing that makes the operator act while the proxy is
        # frozen, so it must fall due after the freeze. It is set on the running job,
        # DEADLINE_AHEAD s past the job's age, and the freeze comes as soon as the
        # operator has taken the edit (a deadline of 60 s from the create left 40 s of
        # waiting; 12 s from the create was a race with the start on a loaded machine).
        started = datetime.fromisoformat(jobs.status("hung")["startTime"])
        age = (datetime.now(UTC) - started).total_seconds()
        deadline = math.ceil(age) + DEADLINE_AHEAD
        patch = {"spec": {"runPolicy": {"activeDeadlineSeconds": deadline}}}
        cluster.kubectl("patch", "hvjob", "hung", "-n", namespace, "--type=merge",
                        "-p", json.dumps(patch))  # fmt: skip
        op.wait(lambda: jobs.status("hung").get("observedGeneration") == 2, 10, "the edit taken")
        proxy.freeze()  # the deadline's reconcile will hang on its status write
        op.wait(lambda: _healthz(op) == 500, 90, "the probe turning red")
        proxy.thaw()
        status = jobs.wait_phase("hung", "Failed", timeout=60)
        assert status["reason"] == "DeadlineExceeded"
        op.wait(lambda: _healthz(op) == 200, 30, "the probe green again")
    finally:
        proxy.close()
        op.stop()


# --- two replicas -------------------------------------------------------------------------


def _lease(cluster: KubeCluster, namespace: str) -> dict[str, Any] | None:
    proc = cluster.kubectl("get", "lease", "op", "-n", namespace, "-o", "json", check=False)
    return json.loads(proc.stdout)["spec"] if proc.returncode == 0 else None


def test_leader_election_fails_over_without_a_second_child(
    cluster: KubeCluster, namespace: str, crd: None, tmp_path: Path
) -> None:
    args = ["--leader-elect", "--leader-election-namespace", namespace]
    args += ["--leader-election-id", "op", "--qps", "10", "--burst", "5"]
    replicas = [Operator(cluster, namespace, tmp_path / f"op-{i}.log") for i in range(2)]
    for op in replicas:
        op.extra_args = args
        op.start()
    try:
        first = replicas[0]
        jobs = Jobs(cluster, namespace, first)
        holder = first.wait(
            lambda: (lease := _lease(cluster, namespace)) and lease["holderIdentity"],
            30,
            "a leader",
        )
        leader = next(op for op in replicas if f"-{op.pid}-" in holder)
        standby = next(op for op in replicas if op is not leader)
        jobs.op = standby
        # No GPUs: the kwok nodes have 32 in all.
        jobs.apply(hvjob("ha", replicas=64, worker={"resources": {"limits": {"cpu": "100m"}}}))
        standby.wait(lambda: len(jobs.pods("ha")) >= 10, 60, "creation under way")
        assert standby.requests("POST", "Pod") == 0  # the standby never acted
        killed = time.monotonic()
        leader.kill()
        standby.wait(
            lambda: (lease := _lease(cluster, namespace)) and lease["holderIdentity"] != holder,
            40,
            "the standby takes the lease",
        )
        failover = time.monotonic() - killed
        print(f"failover after SIGKILL of the leader: {failover:.1f}s")
        assert failover < 25  # lease duration 15 s + retry period 2 s, plus margin
        launcher = jobs.wait_running("ha", timeout=120)
        children = jobs.children("ha")
        assert children == {
            "pods": sorted([*(f"ha-worker-{i}" for i in range(64)), launcher]),
            "jobs.batch": ["ha-launcher"],
            "secrets": ["ha-ssh"],
            "configmaps": ["ha-config"],
            "services": ["ha-worker"],
        }
        assert jobs.status("ha")["restarts"] == 0
        cluster.set_pod_phase(namespace, launcher, "Succeeded")
        jobs.wait_phase("ha", "Succeeded", timeout=60)
    finally:
        for op in replicas:
            op.stop()
            print(f"--- {op.log_path.name} ---\n{op.log_tail(40)}")


def _two_replicas(
    cluster: KubeCluster, namespace: str, tmp_path: Path
) -> tuple[list[Operator], Operator, Operator, str]:
    """Two --leader-elect replicas started: (both, the leader, the standby, its id)."""
    args = ["--leader-elect", "--leader-election-namespace", namespace]
    args += ["--leader-election-id", "op"]
    replicas = [Operator(cluster, namespace, tmp_path / f"op-{i}.log") for i in range(2)]
    for op in replicas:
        op.extra_args = args
        op.start()
    holder = replicas[0].wait(
        lambda: (lease := _lease(cluster, namespace)) and lease["holderIdentity"],
        30,
        "a leader",
    )
    leader = next(op for op in replicas if f"-{op.pid}-" in holder)
    standby = next(op for op in replicas if op is not leader)
    return replicas, leader, standby, holder


def _fail_over(cluster: KubeCluster, namespace: str, leader: Operator, standby: Operator,
               holder: str) -> None:  # fmt: skip
    leader.stop()  # SIGTERM: it releases the Lease
    standby.wait(
        lambda: (lease := _lease(cluster, namespace)) and lease["holderIdentity"] != holder,
        30,
        "the standby takes the lease",
    )


def test_a_refusal_survives_a_failover_without_a_flip_or_a_second_warning(
    cluster: KubeCluster, namespace: str, crd: None, tmp_path: Path
) -> None:
    replicas, leader, standby, holder = _two_replicas(cluster, namespace, tmp_path)
    try:
        jobs = Jobs(cluster, namespace, leader)
        quota = {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": "one-pod"},
            "spec": {"hard": {"pods": "1"}},
        }
        cluster.apply(quota, namespace)
        jobs.op.wait(
            lambda: (
                cluster.get("resourcequota", "one-pod", namespace).get("status", {}).get("hard")
            ),
            30,
            "quota computed",
        )
        jobs.apply(hvjob("held", replicas=2))
        stalled = jobs.op.wait(lambda: jobs.condition("held", "Stalled"), 30, "Stalled")
        assert stalled["reason"] == "CreateForbidden"
        refusals = [m for r, m in jobs.warnings("held") if r == "CreateForbidden"]
        _fail_over(cluster, namespace, leader, standby, holder)
        jobs.op = standby
        standby.stays(
            lambda: jobs.condition("held", "Stalled") == stalled,
            6.0,
            "Stalled unchanged across the failover",
        )
        assert [m for r, m in jobs.warnings("held") if r == "CreateForbidden"] == refusals
        cluster.kubectl("delete", "resourcequota", "one-pod", "-n", namespace)
        jobs.wait_running("held", timeout=90)
    finally:
        for op in replicas:
            op.stop()
            print(f"--- {op.log_path.name} ---\n{op.log_tail(40)}")


def test_a_rejected_edit_survives_a_failover_and_the_job_ends(
    cluster: KubeCluster, namespace: str, crd: None, tmp_path: Path
) -> None:
    """The spec a job runs on after a rejected edit is not the leader's memory: the new
    leader finds it in the job's ConfigMap (accepted.py) and drives the job to its end."""
    replicas, leader, standby, holder = _two_replicas(cluster, namespace, tmp_path)
    try:
        jobs = Jobs(cluster, namespace, leader)
        jobs.apply(hvjob("kept", replicas=2))
        launcher = jobs.wait_running("kept")
        pods = sorted(p["metadata"]["uid"] for p in jobs.pods("kept"))
        patch = {"spec": {"worker": {"template": {"spec": {"containers": [None]}}}}}
        cluster.kubectl(
            "patch", "hvjob", "kept", "-n", namespace, "--type=merge", "-p", json.dumps(patch)
        )
        rejected = jobs.op.wait(lambda: jobs.condition("kept", "SpecRejected"), 20, "rejected")
        warnings = jobs.warnings("kept")
        _fail_over(cluster, namespace, leader, standby, holder)
        jobs.op = standby
        standby.stays(
            lambda: (
                jobs.condition("kept", "SpecRejected") == rejected
                and sorted(p["metadata"]["uid"] for p in jobs.pods("kept")) == pods
            ),
            3.0,
            "the rejection and the pods unchanged across the failover",
        )
        assert jobs.warnings("kept") == warnings
        cluster.set_pod_phase(namespace, launcher, "Succeeded")
        jobs.wait_phase("kept", "Succeeded", timeout=30)
        jobs.op.wait(lambda: not jobs.pods("kept"), 30, "the workers cleaned up")
    finally:
        for op in replicas:
            op.stop()
            print(f"--- {op.log_path.name} ---\n{op.log_tail(40)}")
