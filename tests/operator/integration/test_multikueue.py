"""MultiKueue dispatches a HorovodJob from a manager cluster to a worker cluster:
two real control planes, the real Kueue v0.17 on each (the manager's with its
generic adapter for HorovodJob), and this operator on each.

On the manager the operator creates the job's Workload and nothing else; Kueue
reserves quota, MultiKueue copies the Workload to the worker, where Kueue admits
it, then copies the job, without spec.managedBy; the worker's operator adopts
that Workload and runs the job, and MultiKueue mirrors its status back. When the
job ends there, both Workloads finish and MultiKueue deletes the worker's copies.

Two control planes, two Kueues and two operators on two cores: this module is
the heaviest of the integration tier, so it starts its second cluster once.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from localcluster import crds
from localcluster.kueue import HOROVOD_FRAMEWORK, NAMESPACE, KueueProcess
from localcluster.paths import REPO
from localcluster.pki import embedded_kubeconfig
from localcluster.poll import wait_for
from tests.support.cluster import KubeCluster, named_namespace, session_cluster
from tests.support.fixtures import garbage_collector_knows_horovodjobs
from tests.support.kueue import (
    WORKLOADS,
    find_workload,
    gpu_queue,
    kueue_process,
    queued_job,
    workload_condition,
    workload_true,
)
from tests.support.operator import Jobs, Operator

MULTIKUEUE = "kueue.x-k8s.io/multikueue"
PREBUILT = "kueue.x-k8s.io/prebuilt-workload-name"
CHECK = "multikueue"
WORKER = "worker"
CRD = REPO / "crds" / "horovod.ai_horovodjobs.yaml"


def _apply_crd(cluster: KubeCluster) -> None:
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD))
    crds.wait_established(cluster.kubectl, [crds.HOROVODJOBS])


@pytest.fixture(scope="module")
def worker_cluster() -> Iterator[KubeCluster]:
    """The worker: a second control plane (ports from 19000, HVK_WORKER_PORT_BASE),
    with the HorovodJob CRD before MultiKueue connects (it watches the kind there)."""
    with session_cluster("HVK_WORKER", REPO / ".work" / "test-worker", 19000) as worker:
        _apply_crd(worker)
        garbage_collector_knows_horovodjobs(worker)  # MultiKueue's deletes cascade
        yield worker


@pytest.fixture(scope="module")
def worker_kueue(worker_cluster: KubeCluster) -> Iterator[KueueProcess]:
    with kueue_process(worker_cluster) as process:
        yield process


def _active(cluster: KubeCluster, kind: str, name: str) -> dict[str, Any] | None:
    obj = cluster.get(kind, name)
    return obj if workload_true(obj, "Active") else None


@pytest.fixture(scope="module")
def manager_kueue(
    cluster: KubeCluster, crd: None, worker_cluster: KubeCluster, worker_kueue: KueueProcess
) -> Iterator[KueueProcess]:
    """Kueue on the manager with MultiKueue's adapter for HorovodJob, connected to the
    worker by a kubeconfig Secret (certificates inside: MultiKueue refuses paths)."""
    multi_kueue = {"externalFrameworks": [{"name": HOROVOD_FRAMEWORK}], "gcInterval": "10s"}
    with kueue_process(cluster, multi_kueue=multi_kueue) as process:
        layout = worker_cluster.layout
        kubeconfig = embedded_kubeconfig(layout.server, layout.pki, "admin")
        for obj in (
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "worker-kubeconfig", "namespace": NAMESPACE},
                "stringData": {"kubeconfig": kubeconfig},
            },
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "MultiKueueCluster",
                "metadata": {"name": WORKER},
                "spec": {"clusterSource": {"kubeConfig": {"location": "worker-kubeconfig"}}},
            },
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "MultiKueueConfig",
                "metadata": {"name": "horovod"},
                "spec": {"clusters": [WORKER]},
            },
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "AdmissionCheck",
                "metadata": {"name": CHECK},
                "spec": {
                    "controllerName": MULTIKUEUE,
                    "parameters": {
                        "apiGroup": "kueue.x-k8s.io",
                        "kind": "MultiKueueConfig",
                        "name": "horovod",
                    },
                },
            },
        ):
            cluster.apply(obj)
        wait_for(
            lambda: _active(cluster, "multikueueclusters.kueue.x-k8s.io", WORKER),
            120,
            message="MultiKueueCluster worker Active (connected, its watches started)",
            describe=lambda: process.tail(40),
        )
        wait_for(
            lambda: _active(cluster, "admissionchecks.kueue.x-k8s.io", CHECK),
            60,
            message="AdmissionCheck multikueue Active",
            describe=lambda: process.tail(40),
        )
        yield process


@pytest.fixture
def worker_jobs(
    worker_cluster: KubeCluster, worker_kueue: KueueProcess, namespace: str, tmp_path: Path
) -> Iterator[Jobs]:
    """The worker's operator, on a namespace of the manager's name (MultiKueue keeps
    the name), with a LocalQueue of the same name as the manager's."""
    with named_namespace(worker_cluster, namespace), gpu_queue(worker_cluster, namespace):
        op = Operator(worker_cluster, namespace, tmp_path / "worker-operator.log")
        op.start()
        try:
            yield Jobs(worker_cluster, namespace, op)
        finally:
            op.stop()
            print(f"--- worker's operator log ---\n{op.log_tail(200)}")


def dispatched_job(name: str) -> dict[str, Any]:
    manifest = queued_job(name, 4, "gpus")
    manifest["spec"]["managedBy"] = MULTIKUEUE
    return manifest


def test_multikueue_runs_the_job_on_the_worker_and_mirrors_it_back(
    manager_kueue: KueueProcess,
    worker_jobs: Jobs,
    jobs: Jobs,
    cluster: KubeCluster,
    worker_cluster: KubeCluster,
    namespace: str,
) -> None:
    with gpu_queue(cluster, namespace, admission_checks=[CHECK]):
        jobs.apply(dispatched_job("far"))
        uid = jobs.uid("far")

        # The manager: the job's Workload, controlled by the job, admitted once the
        # worker's Kueue admitted its copy.
        def admitted_here() -> dict[str, Any] | None:
            workload = find_workload(cluster, namespace, "far")
            return workload if workload and workload_true(workload, "Admitted") else None

        workload = jobs.op.wait(admitted_here, 120, "the manager's Workload Admitted")
        # A restart of the manager's operator mid-dispatch: it relists, finds the
        # Workload it made, and makes no second one.
        jobs.op.stop()
        jobs.op.start()
        assert workload["metadata"]["ownerReferences"][0]["uid"] == uid
        assert workload["status"].get("clusterName") == WORKER, workload["status"]
        checks = {c["name"]: c for c in workload["status"]["admissionChecks"]}
        assert checks[CHECK]["state"] == "Ready", checks

        # The worker: MultiKueue's copy of the job, run on MultiKueue's Workload.
        launcher = worker_jobs.wait_running("far", timeout=120)
        copy = worker_jobs.existing("far")
        assert "managedBy" not in copy["spec"]
        assert copy["metadata"]["labels"][PREBUILT] == workload["metadata"]["name"]
        there = find_workload(worker_cluster, namespace, "far")
        assert there is not None and there["metadata"]["name"] == workload["metadata"]["name"]
        owner = there["metadata"]["ownerReferences"]
        assert [(o["uid"], o.get("controller")) for o in owner] == [(copy["metadata"]["uid"], True)]
        assert len(worker_jobs.pods("far")) == 2
        # A restart of the worker's operator: the adopted Workload is the job's own.
        worker_jobs.op.stop()
        worker_jobs.op.start()

        # Mirrored back: the manager's job shows the worker's status; it has no pods.
        jobs.op.wait(lambda: jobs.status("far").get("phase") == "Running", 60, "Running mirrored")
        assert not any(jobs.children("far").values()), jobs.children("far")

        # The job ends on the worker: both Workloads finish, the status comes back,
        # and MultiKueue deletes the worker's copies.
        worker_cluster.set_pod_phase(namespace, launcher, "Succeeded")
        worker_jobs.wait_phase("far", "Succeeded", timeout=60)
        status = jobs.op.wait(
            lambda: (s := jobs.status("far")).get("phase") == "Succeeded" and s,
            90,
            "Succeeded mirrored to the manager",
        )
        assert status["workers"]["replicas"] == 2, status
        finished = jobs.op.wait(
            lambda: workload_condition(find_workload(cluster, namespace, "far") or {}, "Finished"),
            60,
            "the manager's Workload Finished",
        )
        assert (finished["status"], finished["reason"]) == ("True", "Succeeded"), finished
        worker_jobs.op.wait(
            lambda: (
                worker_jobs.get("far") is None
                and find_workload(worker_cluster, namespace, "far") is None
            ),
            90,
            "MultiKueue deleted the worker's job and Workload",
        )
        # Created once: a finished dispatch is not sent again.
        jobs.op.stays(
            lambda: len(cluster.get(WORKLOADS, namespace=namespace)["items"]) == 1,
            3,
            "one Workload on the manager",
        )
        assert worker_jobs.get("far") is None


def test_deleting_the_managers_job_deletes_the_worker_copy(
    manager_kueue: KueueProcess,
    worker_jobs: Jobs,
    jobs: Jobs,
    cluster: KubeCluster,
    worker_cluster: KubeCluster,
    namespace: str,
) -> None:
    with gpu_queue(cluster, namespace, admission_checks=[CHECK]):
        jobs.apply(dispatched_job("gone"))
        worker_jobs.wait_running("gone", timeout=150)
        cluster.kubectl("delete", "hvjob", "gone", "-n", namespace, "--wait=false")
        worker_jobs.op.wait(
            lambda: worker_jobs.get("gone") is None and worker_jobs.pods("gone") == [],
            120,
            "the worker's job and its pods gone",
        )
        worker_jobs.op.wait(
            lambda: find_workload(worker_cluster, namespace, "gone") is None,
            60,
            "the worker's Workload gone",
        )


def test_a_job_without_managed_by_is_refused_by_the_multikueue_queue(
    manager_kueue: KueueProcess,
    worker_jobs: Jobs,
    jobs: Jobs,
    cluster: KubeCluster,
    namespace: str,
) -> None:
    """Kueue's adapter dispatches only a job whose spec.managedBy is MultiKueue's;
    one without it in that queue gets its check Rejected and is never run."""
    with gpu_queue(cluster, namespace, admission_checks=[CHECK]):
        jobs.apply(queued_job("local", 4, "gpus"))

        def rejected() -> dict[str, Any] | None:
            workload = find_workload(cluster, namespace, "local")
            states = ((workload or {}).get("status") or {}).get("admissionChecks") or []
            return next((s for s in states if s.get("state") == "Rejected"), None)

        jobs.op.wait(rejected, 90, "the MultiKueue check Rejected")
        jobs.op.stays(
            lambda: worker_jobs.get("local") is None and jobs.pods("local") == [],
            3,
            "not run on either cluster",
        )
        message = jobs.status("local").get("message") or ""
        assert "admission check multikueue rejected it" in message, message
        assert "Expecting .spec.managedBy" in message, message
