"""Kueue admits HorovodJobs as whole Workloads: the real Kueue v0.17 (with its
webhooks, which the API server calls) and the real kube-scheduler, GPUs on kwok
nodes. Queueing on quota, flavors placing the pods, priority preemption that
suspends (not fails) the lower job, and quota released when a job finishes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from horovod_operator.kube import Kube
from localcluster.kueue import DRA_GPU_RESOURCE, KueueProcess
from tests.support import dra
from tests.support.cluster import KubeCluster
from tests.support.kueue import (
    POOL_LABEL,
    RACK_LABEL,
    WORKLOADS,
    find_workload,
    gpu_queue,
    kueue_process,
    pool_nodes,
    queued_job,
    rack_queue,
    workload_of,
    workload_true,
)
from tests.support.operator import Jobs, hvjob


@pytest.fixture(scope="module")
def kueue(cluster: KubeCluster) -> Iterator[KueueProcess]:
    """Kueue as installed by default: no waitForPodsReady (test_kueue_podsready.py)."""
    with kueue_process(cluster) as process:
        yield process


@pytest.fixture
def queue(kueue: KueueProcess, cluster: KubeCluster, namespace: str) -> Iterator[str]:
    with gpu_queue(cluster, namespace) as name:
        yield name


def _live(jobs: Jobs, name: str, role: str = "worker") -> list[dict[str, Any]]:
    return [p for p in jobs.pods(name, role) if not p["metadata"].get("deletionTimestamp")]


def _on_pool(jobs: Jobs, name: str, namespace: str) -> None:
    """The job's workers went where their flavor says: its node label, its toleration.
    (The launcher requests no resource, so Kueue assigns its pod set no flavor.)"""
    for pod in _live(jobs, name):
        assert pod["spec"]["nodeSelector"] == {POOL_LABEL: namespace}, pod["spec"]
        flavor_toleration = {"key": POOL_LABEL, "operator": "Equal", "value": namespace}
        assert any(flavor_toleration.items() <= t.items() for t in pod["spec"]["tolerations"])
        assert "kueue.x-k8s.io/queue-name" not in pod["metadata"]["labels"]
        node = pod["spec"].get("nodeName")
        assert node and node.startswith(namespace[:40]), (pod["metadata"]["name"], node)


def test_three_jobs_on_eight_gpus_two_run_and_the_third_waits_whole(
    kueue: KueueProcess, queue: str, jobs: Jobs, cluster: KubeCluster, namespace: str
) -> None:
    names = ("first", "second", "third")
    for name in names:
        jobs.apply(queued_job(name, 2, queue))  # 2 workers x 2 GPUs each: two fit in 8

    def running() -> list[str] | None:
        up = [n for n in names if jobs.status(n).get("phase") == "Running"]
        return up if len(up) == 2 else None

    admitted = jobs.op.wait(running, 90, "two jobs Running")
    waiting = next(n for n in names if n not in admitted)
    status = jobs.wait_phase(waiting, "Suspended")
    assert status["reason"] == "QueuedByKueue", status
    assert f"hvjob-{waiting}-0 waits in queue {queue}" in status["message"], status
    jobs.op.wait(
        lambda: "insufficient unused quota" in jobs.status(waiting).get("message", ""),
        30,
        "Kueue's own reason in the waiting job's message",
    )
    assert jobs.pods(waiting) == [] and jobs.pods(waiting, "launcher") == []
    # What a user sees (docs/kueue.md quotes it).
    for kind in ("hj", WORKLOADS):
        print(cluster.kubectl("get", kind, "-n", namespace).stdout)
    print(f"{waiting}: {jobs.status(waiting)['message']}")
    for name in admitted:
        _on_pool(jobs, name, namespace)
        workload = workload_of(cluster, namespace, name)
        assert workload_true(workload, "Admitted"), workload["status"]
        assert workload["metadata"]["ownerReferences"][0]["uid"] == jobs.uid(name)
        assert [(p["name"], p["count"]) for p in workload["spec"]["podSets"]] == [
            ("worker", 2),
            ("launcher", 1),
        ]
    assert not workload_true(workload_of(cluster, namespace, waiting), "Admitted")
    jobs.op.stays(lambda: jobs.pods(waiting) == [], 2.0, f"no pod of {waiting}")

    # The first finishes: its Workload is Finished, the quota goes to the third.
    done = admitted[0]
    cluster.set_pod_phase(namespace, jobs.wait_running(done), "Succeeded")
    jobs.wait_phase(done, "Succeeded")
    jobs.op.wait(
        lambda: workload_true(workload_of(cluster, namespace, done), "Finished"), 30, "Finished"
    )
    jobs.wait_running(waiting, timeout=90)
    _on_pool(jobs, waiting, namespace)
    assert workload_true(workload_of(cluster, namespace, waiting), "Admitted")
    assert jobs.status(waiting)["restarts"] == 0


def test_a_higher_priority_job_preempts_a_lower_one_which_is_suspended_and_resumes(
    kueue: KueueProcess, queue: str, jobs: Jobs, cluster: KubeCluster, namespace: str
) -> None:
    classes = {"low": 10, "high": 1000}
    for name, value in classes.items():
        cluster.apply(
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "WorkloadPriorityClass",
                "metadata": {"name": f"{namespace}-{name}"[:63]},
                "value": value,
            }
        )
    try:
        jobs.apply(queued_job("low", 4, queue, f"{namespace}-low"[:63]))  # 8 GPUs: all of them
        jobs.wait_running("low", timeout=90)
        low_uid_pods = {p["metadata"]["uid"] for p in _live(jobs, "low")}
        workload = workload_of(cluster, namespace, "low")
        assert workload["spec"]["priority"] == 10
        assert workload["spec"]["priorityClassRef"]["kind"] == "WorkloadPriorityClass"

        jobs.apply(queued_job("high", 4, queue, f"{namespace}-high"[:63]))
        # Kueue evicts the lower Workload; its job stops, suspended, not failed.
        evicted = jobs.op.wait(
            lambda: next(
                (
                    e
                    for e in jobs.events("low")
                    if e["reason"] == "EvictedByKueue" and "Preempted" in e["message"]
                ),
                None,
            ),
            60,
            "low evicted (Preempted)",
        )
        assert evicted["type"] == "Normal", evicted
        jobs.wait_running("high", timeout=90)
        _on_pool(jobs, "high", namespace)
        low = jobs.wait_phase("low", "Suspended")
        assert low["reason"] == "QueuedByKueue", low
        assert (low["restarts"], low["uncountedRestarts"]) == (1, 1), low
        assert jobs.condition("low", "Failed") is None
        assert _live(jobs, "low") == [] and _live(jobs, "low", "launcher") == []
        low_wl = workload_of(cluster, namespace, "low")
        assert not workload_true(low_wl, "QuotaReserved") and "admission" not in low_wl["status"]
        assert workload_true(low_wl, "Requeued"), low_wl["status"]

        # The higher job finishes; the lower one is admitted again and resumes as a
        # new attempt (new pods), its eviction never counted against backoffLimit.
        cluster.set_pod_phase(namespace, jobs.wait_running("high"), "Succeeded")
        jobs.wait_phase("high", "Succeeded")
        jobs.wait_running("low", timeout=90)
        resumed = _live(jobs, "low")
        assert {p["metadata"]["labels"]["horovod.ai/attempt"] for p in resumed} == {"1"}
        assert not low_uid_pods & {p["metadata"]["uid"] for p in resumed}
        _on_pool(jobs, "low", namespace)
        status = jobs.status("low")
        assert status["restarts"] - status["uncountedRestarts"] == 0
    finally:
        for name in classes:
            cluster.kubectl(
                "delete", "workloadpriorityclass", f"{namespace}-{name}"[:63], check=False
            )


def test_kueue_webhooks_are_called_and_the_operator_sees_the_workload_api(
    kueue: KueueProcess, cluster: KubeCluster
) -> None:
    assert kueue.webhook_called()
    configured = cluster.get(
        "validatingwebhookconfigurations", "kueue-validating-webhook-configuration"
    )
    urls = {hook["clientConfig"]["url"] for hook in configured["webhooks"]}
    assert (
        f"https://127.0.0.1:{kueue.webhook_port}/validate-kueue-x-k8s-io-v1beta2-workload" in urls
    )

    async def served() -> bool:
        kube = Kube.from_kubeconfig(str(cluster.kubeconfig))
        try:
            return await kube.serves("kueue.x-k8s.io/v1beta2", "workloads")
        finally:
            await kube.close()

    assert asyncio.run(served()) is True


CHECK_CONTROLLER = "test.horovod.ai/provisioning"


def test_an_admission_checks_pod_set_updates_reach_the_admitted_pods(
    kueue: KueueProcess, jobs: Jobs, cluster: KubeCluster, namespace: str
) -> None:
    """A ProvisioningRequest check hands back podSetUpdates (the nodes it provisioned:
    a label, an annotation, a toleration); Kueue admits only once it is Ready, and
    the job's pods must carry them. This test plays the check's controller."""
    check = f"{namespace[:40]}-prov"
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    cluster.apply(
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "AdmissionCheck",
            "metadata": {"name": check},
            "spec": {"controllerName": CHECK_CONTROLLER},
        }
    )
    active = {"type": "Active", "status": "True", "reason": "Active",
              "message": "played by the test", "lastTransitionTime": now}  # fmt: skip
    cluster.kubectl(
        "patch", "admissioncheck", check, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": {"conditions": [active]}}),
    )  # fmt: skip
    try:
        with gpu_queue(cluster, namespace, admission_checks=[check]) as queue:
            jobs.apply(queued_job("checked", 2, queue))

            def pending_check() -> dict[str, Any] | None:
                # The operator creates the Workload a moment after the apply.
                workload = find_workload(cluster, namespace, "checked")
                if workload is None:
                    return None
                states = (workload.get("status") or {}).get("admissionChecks") or []
                return workload if any(s.get("name") == check for s in states) else None

            workload = jobs.op.wait(pending_check, 60, "Kueue waiting for the check")
            assert not workload_true(workload, "Admitted")
            assert jobs.pods("checked") == [], "no pod before the check is Ready"
            toleration = {"key": "provisioned", "operator": "Exists", "effect": "NoSchedule"}
            ready = {
                "name": check,
                "state": "Ready",
                "message": "capacity provisioned",
                "lastTransitionTime": now,
                "podSetUpdates": [
                    {
                        "name": "worker",
                        "labels": {"provisioning.example/request": "req-1"},
                        "annotations": {"provisioning.example/consume": "req-1"},
                        "nodeSelector": {POOL_LABEL: namespace},
                        "tolerations": [toleration],
                    }
                ],
            }
            cluster.kubectl(
                "patch", WORKLOADS, workload["metadata"]["name"], "-n", namespace,
                "--subresource=status", "--type=merge",
                "-p", json.dumps({"status": {"admissionChecks": [ready]}}),
            )  # fmt: skip
            jobs.wait_running("checked", timeout=90)
            for pod in _live(jobs, "checked"):
                meta = pod["metadata"]
                assert meta["labels"]["provisioning.example/request"] == "req-1", meta
                assert meta["annotations"]["provisioning.example/consume"] == "req-1", meta
                assert toleration in pod["spec"]["tolerations"], pod["spec"]
            _on_pool(jobs, "checked", namespace)
            launcher = _live(jobs, "checked", "launcher")
            assert all(
                "provisioning.example/request" not in p["metadata"]["labels"] for p in launcher
            ), "the update named the worker pod set only"
    finally:
        cluster.kubectl("delete", "admissioncheck", check, "--wait=false", check=False)


def test_gpus_claimed_through_dra_count_against_the_queues_quota(
    kueue: KueueProcess, jobs: Jobs, cluster: KubeCluster, namespace: str
) -> None:
    """Kueue's own DRA support (its DynamicResourceAllocation gate and a
    deviceClassMappings entry, localcluster/kueue.py) counts the devices of the
    Workload's ResourceClaimTemplates: 8 claimed GPUs of quota, two jobs of 2 x 4."""
    with (
        gpu_queue(cluster, namespace, resource=DRA_GPU_RESOURCE) as queue,
        dra.gpu_slices(cluster, pool_nodes(namespace)),
    ):
        dra.apply(cluster, dra.claim_template("four-gpus", 4), namespace=namespace)
        manifest = hvjob("first", replicas=2, slotsPerWorker=4, scheduling={"queue": queue})
        jobs.apply(dra.with_claim(manifest, "four-gpus", {"spec": {}}))
        jobs.wait_running("first", timeout=90)
        _on_pool(jobs, "first", namespace)
        admission = workload_of(cluster, namespace, "first")["status"]["admission"]
        (worker,) = [a for a in admission["podSetAssignments"] if a["name"] == "worker"]
        assert worker["resourceUsage"][DRA_GPU_RESOURCE] == "8", worker

        manifest = hvjob("second", replicas=2, slotsPerWorker=4, scheduling={"queue": queue})
        jobs.apply(dra.with_claim(manifest, "four-gpus", {"spec": {}}))
        jobs.op.wait(
            lambda: DRA_GPU_RESOURCE in jobs.status("second").get("message", ""),
            60,
            "the second job queued for the claimed GPUs' quota",
        )
        assert jobs.status("second")["reason"] == "QueuedByKueue"
        assert jobs.pods("second") == []

        cluster.set_pod_phase(namespace, jobs.wait_running("first"), "Succeeded")
        jobs.wait_phase("first", "Succeeded")
        jobs.wait_running("second", timeout=120)
        pods = jobs.pods("second")
        assert {_env_of(p)["HVJOB_GPUS_PER_WORKER"] for p in pods} == {"4"}


def _env_of(pod: dict[str, Any]) -> dict[str, str]:
    container = next(c for c in pod["spec"]["containers"] if c["name"] == "worker")
    return {e["name"]: e.get("value", "") for e in container.get("env") or []}


def test_kueue_topology_aware_scheduling_keeps_each_job_in_one_rack(
    kueue: KueueProcess, jobs: Jobs, cluster: KubeCluster, namespace: str
) -> None:
    """spec.scheduling.topology on a queued job: the Workload asks Kueue for one rack
    (topologyRequest, ranked by horovod.ai/worker-index); the operator puts each worker
    on its slot of Kueue's assignment, and annotates it so Kueue counts it once. Two
    jobs of 12 GPUs in racks of 16: each in one rack, the second in the other."""
    with rack_queue(cluster, namespace) as racks:
        # Kueue's TAS node controller reads tolerations from the Workload's pod sets
        # only: a taint that only the flavor tolerates marks the node failed and evicts
        # the job ("no replacement for unhealthy node(s)"), so the job tolerates it too.
        pool = {"key": POOL_LABEL, "operator": "Equal", "value": namespace, "effect": "NoSchedule"}
        for name in ("left", "right"):
            manifest = queued_job(name, 4, "gpus")
            manifest["spec"]["worker"]["replicas"] = 3
            manifest["spec"]["worker"]["template"] = {"spec": {"tolerations": [pool]}}
            manifest["spec"]["scheduling"]["topology"] = {"key": RACK_LABEL}
            jobs.apply(manifest)
            jobs.wait_running(name, timeout=90)
        used: list[str] = []
        for name in ("left", "right"):
            workload = workload_of(cluster, namespace, name)
            workers = workload["spec"]["podSets"][0]
            assert workers["topologyRequest"] == {
                "required": RACK_LABEL,
                "podIndexLabel": "horovod.ai/worker-index",
            }
            assignment = workload["status"]["admission"]["podSetAssignments"][0]
            assert assignment["topologyAssignment"]["levels"], assignment
            pods = sorted(_live(jobs, name), key=lambda p: p["metadata"]["name"])
            assert len(pods) == 3
            on = {str(p["spec"]["nodeName"]) for p in pods}
            rack = next((r for r, members in racks.items() if on <= set(members)), None)
            assert rack is not None, (name, on, racks)  # one rack
            used.append(rack)
            for pod in pods:
                # Kueue's slot: the hostname level (the lowest) pins the node.
                assert (
                    pod["spec"]["nodeSelector"]["kubernetes.io/hostname"] == pod["spec"]["nodeName"]
                )
                assert (
                    pod["metadata"]["annotations"]["kueue.x-k8s.io/podset-required-topology"]
                    == RACK_LABEL
                )
                assert "affinity" not in pod["spec"]
        assert used[0] != used[1], used  # the first rack had 4 GPUs left: Kueue counted it
        for name in ("left", "right"):
            reasons = [e["reason"] for e in jobs.events(name)]
            assert "EvictedByKueue" not in reasons, (name, reasons)


def test_kueue_topology_too_big_for_a_rack_waits_when_required_and_spreads_when_preferred(
    kueue: KueueProcess, jobs: Jobs, cluster: KubeCluster, namespace: str
) -> None:
    """Three workers of 8 GPUs in racks of 16 (32 GPUs of quota): Required waits in
    the queue saying why; Preferred is admitted across both racks."""
    with rack_queue(cluster, namespace) as racks:
        pool = {"key": POOL_LABEL, "operator": "Equal", "value": namespace, "effect": "NoSchedule"}

        def wide(name: str, mode: str) -> dict[str, Any]:
            manifest = queued_job(name, 8, "gpus")
            manifest["spec"]["worker"]["replicas"] = 3
            manifest["spec"]["worker"]["template"] = {"spec": {"tolerations": [pool]}}
            manifest["spec"]["scheduling"]["topology"] = {"key": RACK_LABEL, "mode": mode}
            return manifest

        jobs.apply(wide("required", "Required"))

        seen: list[str] = []

        def waits_saying_why() -> str | None:
            message = str(jobs.status("required").get("message") or "")
            seen[:] = [message, json.dumps(find_workload(cluster, namespace, "required"))]
            wanted = f"its 3 worker pods must fit in one {RACK_LABEL} domain"
            return message if wanted in message and "queue gpus" in message else None

        try:
            said = jobs.op.wait(waits_saying_why, 60, "the Required job waiting, saying why")
        except Exception:
            print("last message and Workload:", *seen, sep="\n")
            raise
        print(f"required: {said}")
        assert jobs.status("required")["phase"] == "Suspended"
        assert jobs.pods("required") == []
        cluster.kubectl("delete", "hvjob", "required", "-n", namespace)

        jobs.apply(wide("spread", "Preferred"))
        jobs.wait_running("spread", timeout=90)
        on = {str(p["spec"]["nodeName"]) for p in _live(jobs, "spread")}
        spanned = [rack for rack, members in racks.items() if on & set(members)]
        assert len(on) == 3 and len(spanned) == 2, (on, racks)
        for pod in _live(jobs, "spread"):
            annotations = pod["metadata"]["annotations"]
            assert annotations["kueue.x-k8s.io/podset-preferred-topology"] == RACK_LABEL


def test_an_elastic_job_in_a_queue_smaller_than_its_maximum_runs_with_what_kueue_admits(
    kueue: KueueProcess, queue: str, jobs: Jobs, cluster: KubeCluster, namespace: str
) -> None:
    """Partial admission (Kueue's PartialAdmission, Beta and on): up to 6 workers of 2
    GPUs, at least 2, in a queue of 8 GPUs. Kueue admits 4; the job runs with 4."""
    manifest = queued_job("stretch", 2, queue)
    manifest["spec"]["launchMode"] = "gloo"
    manifest["spec"]["elastic"] = {"minReplicas": 2, "maxReplicas": 6}
    manifest["spec"]["worker"]["replicas"] = 6
    jobs.apply(manifest)
    jobs.wait_running("stretch", timeout=90)
    workload = workload_of(cluster, namespace, "stretch")
    workers = workload["spec"]["podSets"][0]
    assert (workers["count"], workers["minCount"]) == (6, 2)
    assert workload["status"]["admission"]["podSetAssignments"][0]["count"] == 4
    live = sorted(p["metadata"]["name"] for p in _live(jobs, "stretch"))
    assert live == [f"stretch-worker-{i}" for i in range(4)]
    assert jobs.status("stretch")["workers"]["replicas"] == 4
    _on_pool(jobs, "stretch", namespace)
    jobs.op.stays(lambda: len(_live(jobs, "stretch")) == 4, 2.0, "no worker past the admitted 4")
