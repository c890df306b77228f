"""The operator against the real control plane: kwok runs the pods, tests drive their phases.

Each test gets a fresh namespace and its own operator process
(`python -m horovod_operator -n <namespace>`), so tests cannot see each
other's jobs and an operator can be killed mid-flight. On a failed wait the
operator's log tail is part of the assertion message.
"""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from localcluster.paths import REPO
from tests.support.cluster import KubeCluster
from tests.support.operator import (
    NO_CHILDREN,
    Jobs,
    Operator,
    condition,
    hand_labelled_worker,
    hvjob,
)

# --- behaviour ----------------------------------------------------------------------------


def test_happy_path_to_succeeded(jobs: Jobs, namespace: str, cluster: KubeCluster) -> None:
    jobs.apply(hvjob("mnist", replicas=2))
    launcher = jobs.wait_running("mnist")

    job = jobs.get("mnist")
    assert job is not None
    uid = job["metadata"]["uid"]
    assert jobs.children("mnist") == {
        "pods": sorted(["mnist-worker-0", "mnist-worker-1", launcher]),
        "jobs.batch": ["mnist-launcher"],
        "secrets": ["mnist-ssh"],
        "configmaps": ["mnist-config"],
        "services": ["mnist-worker"],
    }
    for kind, name in [
        ("secret", "mnist-ssh"),
        ("configmap", "mnist-config"),
        ("service", "mnist-worker"),
        ("pod", "mnist-worker-0"),
        ("job.batch", "mnist-launcher"),
    ]:
        owners = cluster.get(kind, name, namespace)["metadata"]["ownerReferences"]
        assert [(o["kind"], o["uid"], o["controller"]) for o in owners] == [
            ("HorovodJob", uid, True)
        ]
    config = cluster.get("configmap", "mnist-config", namespace)["data"]
    assert config["hostfile"] == (
        f"mnist-worker-0.mnist-worker.{namespace}.svc slots=1\n"
        f"mnist-worker-1.mnist-worker.{namespace}.svc slots=1\n"
    )
    launcher_job = cluster.get("job.batch", "mnist-launcher", namespace)
    command = launcher_job["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[:5] == ["python", "-m", "horovod_worker.sshd", "--client-only", "--"]
    assert command[5:10] == ["python", "-m", "horovod_worker.horovodrun", "-np", "2"]
    worker = cluster.get("pod", "mnist-worker-0", namespace)
    assert worker["spec"]["hostname"] == "mnist-worker-0"
    assert worker["spec"]["subdomain"] == "mnist-worker"
    assert worker["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"

    status = jobs.status("mnist")
    assert status["workers"]["ready"] == 2
    assert status["launcher"]["podName"] == launcher
    assert status["observedGeneration"] == 1
    assert condition(status, "Created")["status"] == "True"

    columns = cluster.kubectl("get", "hj", "mnist", "-n", namespace).stdout
    assert "Running" in columns and "2/2" in columns

    cluster.set_pod_phase(namespace, launcher, "Succeeded")
    status = jobs.wait_phase("mnist", "Succeeded")
    assert condition(status, "Succeeded")["reason"] == "LauncherSucceeded"
    assert status["completionTime"] >= status["startTime"]
    # cleanPodPolicy Running (the default): the workers' sshd is stopped.
    jobs.op.wait(lambda: jobs.pods("mnist") == [], 20, "workers deleted")
    reasons = [e["reason"] for e in jobs.events("mnist")]
    assert "LauncherSucceeded" in reasons and "LauncherRunning" in reasons


def test_launcher_waits_for_every_worker_ready(
    jobs: Jobs, namespace: str, cluster: KubeCluster
) -> None:
    label = f"hvk-gate-{namespace}"[:63]
    manifest = hvjob("gated", replicas=2)
    manifest["spec"]["worker"]["template"] = {"spec": {"nodeSelector": {label: "yes"}}}
    jobs.apply(manifest)
    # The scheduler marks the pods Unschedulable and the operator says so: from
    # then on it has seen the pending workers, and the launcher must still wait.
    stalled = jobs.op.wait(lambda: jobs.condition("gated", "Stalled"), 30, "Stalled")
    assert stalled["reason"] == "Unschedulable"
    assert "gated-worker-" in stalled["message"] and "node affinity/selector" in stalled["message"]
    jobs.op.stays(lambda: jobs.objects("jobs.batch", "horovod.ai/job-name=gated") == [], 1.0)
    assert jobs.status("gated")["phase"] == "Pending"

    node = cluster.get("nodes")["items"][0]["metadata"]["name"]
    cluster.kubectl("label", "node", node, f"{label}=yes")
    try:
        jobs.wait_running("gated")
        assert len(jobs.ready_workers("gated")) == 2
    finally:
        cluster.kubectl("label", "node", node, f"{label}-")


def test_at_startup_creates_the_launcher_at_once(jobs: Jobs, namespace: str) -> None:
    manifest = hvjob("eager", replicas=2, runPolicy={"launcherCreationPolicy": "AtStartup"})
    manifest["spec"]["worker"]["template"] = {"spec": {"nodeSelector": {"nowhere": "x"}}}
    jobs.apply(manifest)
    jobs.op.wait(lambda: jobs.objects("jobs.batch", "horovod.ai/job-name=eager"), 20, "launcher")
    assert jobs.ready_workers("eager") == []


def test_oom_worker_restarts_then_fails_after_backoff(
    jobs: Jobs, namespace: str, cluster: KubeCluster
) -> None:
    jobs.apply(hvjob("oom", replicas=2, runPolicy={"backoffLimit": 1}))
    jobs.wait_running("oom")
    old_uid = cluster.get("pod", "oom-worker-1", namespace)["metadata"]["uid"]
    cluster.set_pod_phase(namespace, "oom-worker-1", "Failed", exit_code=137, reason="OOMKilled")

    def restarted() -> bool:
        status = jobs.status("oom")
        pods = jobs.pods("oom")
        return (
            status.get("restarts") == 1
            and status.get("phase") == "Running"
            and sorted(p["metadata"]["labels"]["horovod.ai/attempt"] for p in pods) == ["1", "1"]
        )

    jobs.op.wait(restarted, 40, "a restart with fresh pods")
    assert cluster.get("pod", "oom-worker-1", namespace)["metadata"]["uid"] != old_uid
    status = jobs.status("oom")
    assert status["failures"] == [
        {"pod": "oom-worker-1", "container": "worker", "exitCode": 137, "reason": "OOMKilled"}
    ]
    assert condition(status, "Restarting")["status"] == "False"

    cluster.set_pod_phase(namespace, "oom-worker-0", "Failed", exit_code=137, reason="OOMKilled")
    status = jobs.wait_phase("oom", "Failed")
    failed = condition(status, "Failed")
    assert failed["reason"] == "WorkerFailed"
    assert "oom-worker-0" in failed["message"] and "backoffLimit (1) reached" in failed["message"]
    assert status["failures"][0] == {
        "pod": "oom-worker-0",
        "container": "worker",
        "exitCode": 137,
        "reason": "OOMKilled",
    }
    assert status["restarts"] == 1
    assert "WorkerFailed" in [e["reason"] for e in jobs.events("oom")]


def test_evicted_worker_restarts_without_counting_naming_the_eviction(
    jobs: Jobs, namespace: str, cluster: KubeCluster
) -> None:
    jobs.apply(hvjob("evict", replicas=2, runPolicy={"backoffLimit": 0}))
    jobs.wait_running("evict")
    cluster.set_pod_phase(namespace, "evict-worker-0", "Failed", exit_code=137, reason="Evicted")

    def restarted() -> dict[str, Any] | None:
        status = jobs.status("evict")
        return status if status.get("restarts") == 1 and status.get("phase") == "Running" else None

    status = jobs.op.wait(restarted, 40, "a restart that is not counted")
    assert status["uncountedRestarts"] == 1
    assert status["failures"] == [
        {"pod": "evict-worker-0", "container": "worker", "exitCode": 137, "reason": "Evicted"}
    ]
    warnings = [m for r, m in jobs.warnings("evict") if r == "WorkerFailed"]
    assert any("a disruption (Evicted) is not counted" in m for m in warnings), warnings


def test_evictions_count_when_a_rule_says_so(
    jobs: Jobs, namespace: str, cluster: KubeCluster
) -> None:
    rules = [{"action": "Count", "onPodConditions": [{"type": "DisruptionTarget"}]}]
    policy = {"backoffLimit": 0, "podFailurePolicy": {"rules": rules}}
    jobs.apply(hvjob("strict", replicas=2, runPolicy=policy))
    jobs.wait_running("strict")
    cluster.set_pod_phase(namespace, "strict-worker-0", "Failed", exit_code=137, reason="Evicted")
    status = jobs.wait_phase("strict", "Failed")
    assert "backoffLimit (0) reached" in status["message"]
    # cleanPodPolicy Running: the surviving worker and the launcher are stopped,
    # the failed pod is kept for its logs.
    jobs.op.wait(
        lambda: [p["metadata"]["name"] for p in jobs.pods("strict")] == ["strict-worker-0"],
        20,
        "running pods cleaned",
    )


def test_an_evicted_launcher_restarts_the_attempt_without_counting_it(
    jobs: Jobs, namespace: str, cluster: KubeCluster
) -> None:
    """The Eviction API (a drain, kubectl evict): the launcher's Job has backoffLimit 0
    and its pod is gone by the time the Job says Failed; the disruption is the pod's
    DisruptionTarget condition, seen while it terminated."""
    jobs.apply(hvjob("drained", replicas=2, runPolicy={"backoffLimit": 0}))
    launcher = jobs.wait_running("drained")
    eviction = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": launcher, "namespace": namespace},
    }
    cluster.kubectl(
        "create", "--raw", f"/api/v1/namespaces/{namespace}/pods/{launcher}/eviction",
        "-f", "-", input=json.dumps(eviction),
    )  # fmt: skip

    def restarted() -> dict[str, Any] | None:
        status = jobs.status("drained")
        return status if status.get("restarts") == 1 else None

    status = jobs.op.wait(restarted, 60, "an uncounted restart")
    assert status["uncountedRestarts"] == 1, status
    assert status["phase"] != "Failed", status
    second = jobs.wait_running("drained", timeout=60)
    assert second != launcher
    warnings = [m for r, m in jobs.warnings("drained") if r == "LauncherFailed"]
    assert any("is not counted" in m for m in warnings), warnings


def test_launcher_failure_restarts(jobs: Jobs, namespace: str, cluster: KubeCluster) -> None:
    jobs.apply(hvjob("lf", replicas=1, runPolicy={"backoffLimit": 2}))
    launcher = jobs.wait_running("lf")
    cluster.set_pod_phase(namespace, launcher, "Failed", exit_code=3)
    jobs.op.wait(lambda: jobs.status("lf").get("restarts") == 1, 30, "restart counted")
    second = jobs.wait_running("lf")
    assert second != launcher
    assert jobs.status("lf")["failures"][0]["exitCode"] == 3


def test_failed_launcher_log_tail_outlives_its_pod(
    jobs: Jobs, namespace: str, cluster: KubeCluster
) -> None:
    jobs.apply(hvjob("lost", replicas=1, runPolicy={"backoffLimit": 0, "cleanPodPolicy": "All"}))
    launcher = jobs.wait_running("lost")
    cluster.set_pod_phase(
        namespace, launcher, "Failed", exit_code=3, message="epoch 1 loss 0.7\nboom: exit 3"
    )
    status = jobs.wait_phase("lost", "Failed")
    jobs.op.wait(lambda: not jobs.pods("lost", "launcher"), 30, "launcher pod removed")
    (failure,) = jobs.status("lost")["failures"]
    assert (failure["exitCode"], failure["message"]) == (3, "epoch 1 loss 0.7\nboom: exit 3")
    assert status["launcher"]["exitCode"] == 3


def test_deadline_exceeded(jobs: Jobs, namespace: str, cluster: KubeCluster) -> None:
    # The deadline is set once the job runs (it applies at the next reconcile, counted
    # from status.startTime): a deadline set at apply raced the start on a loaded machine.
    jobs.apply(hvjob("late", replicas=2))
    jobs.wait_running("late")
    patch = '{"spec": {"runPolicy": {"activeDeadlineSeconds": 1}}}'
    cluster.kubectl("patch", "hvjob", "late", "-n", namespace, "--type=merge", "-p", patch)
    status = jobs.wait_phase("late", "Failed", timeout=20)
    assert condition(status, "Failed")["reason"] == "DeadlineExceeded"
    jobs.op.wait(lambda: jobs.objects("pods", "horovod.ai/job-name=late") == [], 20, "pods removed")
    # The launcher Job goes after its pods (a foreground delete): the garbage collector
    # removes it once they are gone, a moment later on a loaded machine.
    jobs.op.wait(
        lambda: jobs.objects("jobs.batch", "horovod.ai/job-name=late") == [], 20, "Job removed"
    )


def test_suspend_and_resume(jobs: Jobs, namespace: str, cluster: KubeCluster) -> None:
    jobs.apply(hvjob("pause", replicas=2))
    jobs.wait_running("pause")
    patch = '{"spec": {"runPolicy": {"suspend": true}}}'
    cluster.kubectl("patch", "hvjob", "pause", "-n", namespace, "--type=merge", "-p", patch)
    status = jobs.wait_phase("pause", "Suspended")
    assert condition(status, "Suspended")["status"] == "True"
    jobs.op.wait(lambda: jobs.objects("pods", "horovod.ai/job-name=pause") == [], 20, "pods gone")
    # After its pods, as above (CI's warm run of ea2637f saw it still foreground-deleting).
    jobs.op.wait(
        lambda: jobs.objects("jobs.batch", "horovod.ai/job-name=pause") == [], 20, "Job gone"
    )
    assert jobs.get("pause") is not None

    patch = '{"spec": {"runPolicy": {"suspend": false}}}'
    cluster.kubectl("patch", "hvjob", "pause", "-n", namespace, "--type=merge", "-p", patch)
    jobs.wait_running("pause")
    status = jobs.status("pause")
    assert condition(status, "Suspended")["reason"] == "JobResumed"
    assert status["restarts"] == 0


@pytest.mark.parametrize(
    ("policy", "workers_left", "launcher_left"), [("None", 2, True), ("All", 0, False)]
)
def test_clean_pod_policy(
    jobs: Jobs,
    namespace: str,
    cluster: KubeCluster,
    policy: str,
    workers_left: int,
    launcher_left: bool,
) -> None:
    jobs.apply(hvjob("clean", replicas=2, runPolicy={"cleanPodPolicy": policy}))
    launcher = jobs.wait_running("clean")
    cluster.set_pod_phase(namespace, launcher, "Succeeded")
    jobs.wait_phase("clean", "Succeeded")
    if workers_left == 0:
        jobs.op.wait(lambda: jobs.pods("clean") == [], 20, "workers deleted")
        jobs.op.wait(
            lambda: not jobs.objects("jobs.batch", "horovod.ai/job-name=clean"), 20, "gone"
        )
    else:
        # The Succeeded Event is posted just before cleanup's deletes would be sent.
        jobs.op.wait(lambda: "LauncherSucceeded" in [e["reason"] for e in jobs.events("clean")])
        jobs.op.stays(lambda: jobs.op.pod_deletes() == 0, 1.0, "no pod deleted")
        assert len(jobs.pods("clean")) == workers_left
        assert bool(jobs.objects("jobs.batch", "horovod.ai/job-name=clean")) is launcher_left


def test_finished_workers_go_in_one_request_and_no_other_pod_with_them(
    jobs: Jobs, namespace: str, cluster: KubeCluster
) -> None:
    # A pod with the job's labels but not its UID (someone's copy): the collection
    # delete's selector must not take it.
    bystander = hand_labelled_worker("bystander", "sweep")
    cluster.apply(bystander, namespace)
    jobs.apply(hvjob("sweep", replicas=3))
    launcher = jobs.wait_running("sweep")
    cluster.set_pod_phase(namespace, launcher, "Succeeded")
    jobs.wait_phase("sweep", "Succeeded")
    jobs.op.wait(
        lambda: [p["metadata"]["name"] for p in jobs.pods("sweep")] == ["bystander"],
        20,
        "the three workers deleted",
    )
    assert jobs.op.requests("DELETECOLLECTION", "Pod") == 1
    assert jobs.op.requests("DELETE", "Pod") == 0
    jobs.op.stays(lambda: cluster.exists("pod", "bystander", namespace), 1.0, "bystander kept")


def test_ttl_after_finished_deletes_the_job(
    jobs: Jobs, namespace: str, cluster: KubeCluster
) -> None:
    jobs.apply(hvjob("short", replicas=1, runPolicy={"ttlSecondsAfterFinished": 2}))
    launcher = jobs.wait_running("short")
    cluster.set_pod_phase(namespace, launcher, "Succeeded")
    jobs.wait_phase("short", "Succeeded")
    jobs.op.wait(lambda: jobs.get("short") is None, 20, "job deleted by ttl")


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"worker": {"replicas": 3}}, "cannot change while the job is started"),
        ({"slotsPerWorker": 2}, "cannot change while the job is started"),
        (
            {"slotsPerWorker": 2, "worker": {"resources": {"limits": {"nvidia.com/gpu": 2}}}},
            "cannot change while the job is started",
        ),
    ],
)
def test_shape_edits_of_a_running_job_are_refused_at_apply_time(
    jobs: Jobs, namespace: str, cluster: KubeCluster, patch: dict[str, Any], message: str
) -> None:
    jobs.apply(hvjob("fixed", replicas=2))
    jobs.wait_running("fixed")
    pods = sorted(p["metadata"]["uid"] for p in jobs.pods("fixed"))
    proc = cluster.kubectl(
        "patch",
        "hvjob",
        "fixed",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        json.dumps({"spec": patch}),
        check=False,
    )
    assert proc.returncode != 0
    assert message in proc.stderr
    assert jobs.existing("fixed")["metadata"]["generation"] == 1
    assert sorted(p["metadata"]["uid"] for p in jobs.pods("fixed")) == pods
    assert jobs.status("fixed")["phase"] == "Running"


def test_shape_edits_of_a_suspended_job_are_taken_at_resume(
    jobs: Jobs, namespace: str, cluster: KubeCluster
) -> None:
    jobs.apply(hvjob("grow", replicas=2, runPolicy={"suspend": True}))
    jobs.wait_phase("grow", "Suspended")
    patch = {"spec": {"worker": {"replicas": 3}, "runPolicy": {"suspend": False}}}
    cluster.kubectl(
        "patch", "hvjob", "grow", "-n", namespace, "--type=merge", "-p", json.dumps(patch)
    )
    jobs.wait_running("grow")
    assert len(jobs.ready_workers("grow")) == 3
    hostfile = cluster.get("configmap", "grow-config", namespace)["data"]["hostfile"]
    assert hostfile.count("slots=1") == 3


def test_deleting_the_job_collects_every_child(
    jobs: Jobs, namespace: str, cluster: KubeCluster
) -> None:
    jobs.apply(hvjob("gone", replicas=2))
    jobs.wait_running("gone")
    cluster.kubectl("delete", "hvjob", "gone", "-n", namespace, "--wait=false")
    jobs.op.wait(lambda: jobs.children("gone") == NO_CHILDREN, 40, "garbage collection")


def test_deleted_during_creation_leaves_nothing(
    jobs: Jobs, namespace: str, cluster: KubeCluster
) -> None:
    jobs.apply(hvjob("blink", replicas=8))
    jobs.op.wait(lambda: jobs.objects("pods", "horovod.ai/job-name=blink"), 20, "first pods")
    cluster.kubectl("delete", "hvjob", "blink", "-n", namespace, "--wait=false")
    jobs.op.wait(lambda: jobs.children("blink") == NO_CHILDREN, 40, "garbage collection")
    jobs.op.stays(lambda: jobs.children("blink") == NO_CHILDREN, 2.0, "nothing comes back")


# --- bad input ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"worker": {"replicas": "two"}}, "spec.worker.replicas"),
        ({"worker": {"replicas": -1}}, "spec.worker.replicas"),
        ({"launchMode": "nccl"}, "spec.launchMode"),
        ({"slotsPerWorker": 0}, "spec.slotsPerWorker"),
        ({"bogusField": 1}, "bogusField"),
        ({"worker": {"replica": 2}}, "replica"),
        ({"worker": {"replicas": 100000}}, "spec.worker.replicas: Invalid value: 100000"),
        ({"slotsPerWorker": 2}, "spec.slotsPerWorker: Invalid value: slotsPerWorker is more than"),
        ({"runPolicy": {"activeDeadlineSeconds": 10**12}}, "spec.runPolicy.activeDeadlineSeconds"),
        ({"runPolicy": {"ttlSecondsAfterFinished": 10**12}}, "ttlSecondsAfterFinished"),
        (
            {"launchMode": "gloo", "launcher": {"horovodrunArgs": ["--verbose"]}},
            "spec.launchMode: Invalid value: launcher.horovodrunArgs and ssh.authMountPath need",
        ),
        ({"ssh": {"port": 22}}, "spec.ssh.port: Invalid value: ssh.port is the port of an image"),
        ({"ssh": {"authMountPath": "root"}}, "spec.ssh.authMountPath"),
    ],
)
def test_schema_violations_are_rejected_at_apply_time(
    cluster: KubeCluster, namespace: str, crd: None, change: dict[str, Any], message: str
) -> None:
    manifest = hvjob("bad")
    for key, value in change.items():
        if isinstance(value, dict):
            manifest["spec"][key] = {**manifest["spec"].get(key, {}), **value}
        else:
            manifest["spec"][key] = value
    proc = cluster.kubectl(
        "apply", "-n", namespace, "-f", "-", input=json.dumps(manifest), check=False
    )
    assert proc.returncode != 0, proc.stdout
    assert message in proc.stderr
    assert not cluster.exists("hvjob", "bad", namespace)


@pytest.mark.parametrize(
    ("name", "change", "message"),
    [
        ("x" * 55, {}, "metadata.name"),
        (
            "envmap",
            {"worker": {"template": {"spec": {"containers": [{"name": "w", "env": {"A": "1"}}]}}}},
            "spec.worker.template: spec.containers[0].env must be a list of objects, got dict",
        ),
        (
            "nullcontainer",
            {"launcher": {"template": {"spec": {"containers": [None]}}}},
            "spec.launcher.template: spec.containers[0] must be an object, got null",
        ),
        (
            "badtpl",
            {"worker": {"template": {"spec": {"containers": [{"name": "Bad_Name"}]}}}},
            "spec.worker.template: the API server rejected the worker pod",
        ),
    ],
)
def test_semantic_errors_fail_with_invalid_spec(
    jobs: Jobs, namespace: str, name: str, change: dict[str, Any], message: str
) -> None:
    manifest = hvjob(name)
    for key, value in change.items():
        if isinstance(value, dict):
            manifest["spec"][key] = {**manifest["spec"].get(key, {}), **value}
        else:
            manifest["spec"][key] = value
    jobs.apply(manifest)
    status = jobs.wait_phase(name, "Failed")
    failed = condition(status, "Failed")
    assert failed["reason"] == "InvalidSpec"
    assert message in failed["message"]
    warnings = jobs.op.wait(
        lambda: [(e["type"], e["reason"]) for e in jobs.events(name) if e["type"] == "Warning"],
        10,
        "a Warning event",
    )
    assert warnings == [("Warning", "InvalidSpec")]
    jobs.op.wait(lambda: jobs.children(name) == NO_CHILDREN, 20, "no children left")
    # No retry loop: the status stays as it is.
    version = jobs.existing(name)["metadata"]["resourceVersion"]
    jobs.op.stays(
        lambda: jobs.existing(name)["metadata"]["resourceVersion"] == version,
        2.0,
        "the job unchanged",
    )
    # And the operator keeps serving other jobs.
    jobs.apply(hvjob("fine", replicas=1))
    jobs.wait_running("fine")


# --- examples, runtime --------------------------------------------------------------------


@pytest.mark.parametrize("path", sorted((REPO / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_examples_pass_server_side_dry_run(
    cluster: KubeCluster, namespace: str, crd: None, path: Path
) -> None:
    proc = cluster.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", str(path))
    for document in yaml.safe_load_all(path.read_text()):
        kind, name = document["kind"], document["metadata"]["name"]
        shown = "horovodjob.horovod.ai" if kind == "HorovodJob" else kind.lower()
        assert f"{shown}/{name} created (server dry run)" in proc.stdout, proc.stdout


def test_example_runs_to_succeeded(jobs: Jobs, namespace: str, cluster: KubeCluster) -> None:
    example = yaml.safe_load((REPO / "examples" / "pytorch-digits.yaml").read_text())
    # What the chart's --default-image (workerImage) gives it; this operator has none.
    example["spec"].setdefault("image", "horovod-worker:0.1.0-torch-gpu")
    cluster.apply(example, namespace)
    launcher = jobs.wait_running("pytorch-digits")
    cluster.set_pod_phase(namespace, launcher, "Succeeded")
    jobs.wait_phase("pytorch-digits", "Succeeded")


def api_writes(metrics: str) -> dict[str, int]:
    """POST, PATCH and DELETE requests of the operator by kind, from /metrics."""
    counts = dict.fromkeys(
        ("Pod", "Job", "Secret", "ConfigMap", "Service", "Event", "HorovodJob"), 0
    )
    for line in metrics.splitlines():
        if line.startswith("horovod_operator_api_requests_total{"):
            labels = dict(
                item.split("=", 1)
                for item in line[line.index("{") + 1 : line.index("}")].split(",")
            )
            if labels["verb"].strip('"') in ("POST", "PATCH", "DELETE"):
                kind = labels["kind"].strip('"')
                counts[kind] = counts.get(kind, 0) + int(float(line.rsplit(" ", 1)[1]))
    return counts


def test_health_and_metrics_endpoints(jobs: Jobs, namespace: str, cluster: KubeCluster) -> None:
    base = f"http://127.0.0.1:{jobs.op.port}"

    def get(path: str) -> str | None:
        try:
            with urllib.request.urlopen(base + path, timeout=2) as response:
                body: str = response.read().decode()
                return body
        except OSError:
            return None

    jobs.op.wait(lambda: get("/readyz"), 20, "readiness")
    assert get("/healthz") == "ok\n"
    jobs.apply(hvjob("metered", replicas=4))
    launcher = jobs.wait_running("metered")
    writes = api_writes(get("/metrics") or "")
    print(f"API writes until Running, 4 workers: {writes}")
    # Secret, ConfigMap, Service, 4 pods, launcher, the status once the pods are
    # seen and at Running (more when kwok readies the pods far apart), one Event.
    assert writes["Pod"] == 4 and writes["Job"] == 1
    assert writes["Secret"] == writes["ConfigMap"] == writes["Service"] == 1
    assert writes["Event"] == 1
    assert 2 <= writes["HorovodJob"] <= 5
    cluster.set_pod_phase(namespace, launcher, "Succeeded")
    jobs.wait_phase("metered", "Succeeded")
    metrics = get("/metrics") or ""
    assert "horovod_operator_jobs_created_total 1.0" in metrics
    assert "horovod_operator_jobs_succeeded_total 1.0" in metrics
    assert "horovod_operator_reconcile_duration_seconds_count" in metrics
    # The loop's lag is measured from the start (a sample every 0.1 s).
    lag_samples = re.search(r"^horovod_operator_event_loop_lag_seconds_count (\S+)$", metrics, re.M)
    assert lag_samples is not None and float(lag_samples.group(1)) >= 1, metrics
    namespace_label = f'namespace="{namespace}"'
    assert f'horovod_operator_jobs{{{namespace_label},phase="Succeeded"}} 1.0' in metrics
    assert f'horovod_operator_jobs{{{namespace_label},phase="Running"}} 0.0' in metrics
    assert f"horovod_operator_job_time_to_running_seconds_count{{{namespace_label}}} 1.0" in metrics
    duration = f'horovod_operator_job_duration_seconds_count{{{namespace_label},phase="Succeeded"}}'
    assert f"{duration} 1.0" in metrics


# --- restart safety -----------------------------------------------------------------------


def test_sigkill_during_creation_converges(
    jobs: Jobs, operator: Operator, namespace: str, cluster: KubeCluster
) -> None:
    """Kill -9 the operator at several points of an 8-worker creation; restart each time.

    A low request rate stretches creation over seconds so that the kills land
    between the writes. Afterwards there is exactly one of every child, the
    first SSH key was kept, and the job still succeeds.
    """
    operator.stop()
    operator.extra_args = ["--qps", "4", "--burst", "1"]
    operator.start()
    jobs.apply(hvjob("big", replicas=8))

    def workers() -> int:
        return len(jobs.pods("big"))

    kill_points: list[tuple[str, Callable[[], object]]] = [
        ("secret created", lambda: cluster.exists("secret", "big-ssh", namespace)),
        ("some workers", lambda: workers() >= 2),
        ("more workers", lambda: workers() >= 5),
        ("all workers", lambda: workers() == 8),
    ]
    first_key = None
    for label, reached in kill_points:
        operator.wait(reached, 60, label)
        operator.kill()
        if first_key is None:
            first_key = cluster.get("secret", "big-ssh", namespace)["data"]["id_ed25519"]
        children = jobs.children("big")
        worker_pods = [p for p in children["pods"] if p.startswith("big-worker-")]
        launchers = [p for p in children["pods"] if p.startswith("big-launcher-")]
        # Only the job's 8 workers; once they all exist the launcher may be there too.
        assert set(worker_pods) <= {f"big-worker-{i}" for i in range(8)}, children
        assert len(launchers) <= 1 and len(children["jobs.batch"]) <= 1, children
        operator.start()

    launcher = jobs.wait_running("big", timeout=90)
    children = jobs.children("big")
    assert children == {
        "pods": sorted([*(f"big-worker-{i}" for i in range(8)), launcher]),
        "jobs.batch": ["big-launcher"],
        "secrets": ["big-ssh"],
        "configmaps": ["big-config"],
        "services": ["big-worker"],
    }
    assert cluster.get("secret", "big-ssh", namespace)["data"]["id_ed25519"] == first_key
    assert jobs.status("big")["restarts"] == 0
    cluster.set_pod_phase(namespace, launcher, "Succeeded")
    jobs.wait_phase("big", "Succeeded", timeout=30)
