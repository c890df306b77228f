"""Elastic jobs against the real control plane (kwok runs the pods; the training runs
for real at the e2e rung, tests/e2e/test_elastic.py).

The CRD refuses an elastic job in mpi mode and an edit of a started job's
elastic bounds; the operator keeps maxReplicas workers, starts the launcher at
worker.replicas Ready, and answers a deleted worker with a replacement (a new
pod, same name) instead of a restart, saying so in the status and an Event.
"""

from __future__ import annotations

import json
from typing import Any

from tests.support.cluster import KubeCluster
from tests.support.operator import Jobs, hvjob

ELASTIC = {"minReplicas": 1, "maxReplicas": 3}


def elastic_job(name: str, **spec: Any) -> dict[str, Any]:
    spec.setdefault("launchMode", "gloo")
    return hvjob(name, replicas=2, elastic=ELASTIC, **spec)


def refused(cluster: KubeCluster, namespace: str, manifest: dict[str, Any]) -> str:
    proc = cluster.kubectl(
        "apply", "-n", namespace, "-f", "-", input=json.dumps(manifest), check=False
    )
    assert proc.returncode != 0, proc.stdout
    return proc.stderr


def test_the_crd_refuses_elastic_mpi_jobs_and_start_counts_out_of_bounds(
    jobs: Jobs, cluster: KubeCluster, namespace: str
) -> None:
    mpi = elastic_job("bad-mode", launchMode="mpi")
    assert "spec.elastic: Invalid value: elastic needs launchMode gloo" in refused(
        cluster, namespace, mpi
    )
    wide = hvjob("bad-count", replicas=4, launchMode="gloo", elastic=ELASTIC)
    message = refused(cluster, namespace, wide)
    assert "spec.worker.replicas" in message and "between elastic.minReplicas" in message


def test_a_deleted_worker_is_replaced_and_the_job_goes_on(
    jobs: Jobs, namespace: str, cluster: KubeCluster
) -> None:
    jobs.apply(elastic_job("grow"))
    jobs.wait_running("grow")
    workers = {p["metadata"]["name"]: p["metadata"]["uid"] for p in jobs.pods("grow")}
    assert sorted(workers) == ["grow-worker-0", "grow-worker-1", "grow-worker-2"]
    launcher = cluster.get("job", "grow-launcher", namespace)["spec"]["template"]["spec"]
    command = launcher["containers"][0]["command"]
    assert command[:3] == ["python", "-m", "horovod_worker.elastic_launcher"]
    assert command[command.index("--max-np") + 1] == "3"

    cluster.kubectl("delete", "pod", "grow-worker-1", "-n", namespace, "--wait=false")

    def replaced() -> bool:
        now = {p["metadata"]["name"]: p["metadata"]["uid"] for p in jobs.pods("grow")}
        return now.get("grow-worker-1") not in (None, workers["grow-worker-1"])

    jobs.op.wait(replaced, 40, "a new grow-worker-1")
    status = jobs.status("grow")
    assert status["phase"] == "Running" and status["restarts"] == 0, status
    # Gone between two looks (kwok deletes at once): named from the pods last seen,
    # by the start of its UID.
    lost = status["elastic"]["lostWorkers"]
    assert [(w["pod"], w["reason"], w["counted"]) for w in lost] == [
        ("grow-worker-1", "PodDeleted", False)
    ], status["elastic"]
    assert workers["grow-worker-1"].startswith(lost[0]["uid"]), lost
    # The two that stayed are the same pods.
    now = {p["metadata"]["name"]: p["metadata"]["uid"] for p in jobs.pods("grow")}
    assert now["grow-worker-0"] == workers["grow-worker-0"]
    assert now["grow-worker-2"] == workers["grow-worker-2"]
    assert any(
        e["reason"] == "WorkerLost" and "grow-worker-1" in e["message"] for e in jobs.events("grow")
    )


def test_the_elastic_bounds_of_a_started_job_cannot_change(
    jobs: Jobs, namespace: str, cluster: KubeCluster
) -> None:
    jobs.apply(elastic_job("fixed-bounds"))
    jobs.wait_running("fixed-bounds")
    for patch in ({"maxReplicas": 4}, {"timeoutSeconds": 60}):
        proc = cluster.kubectl(
            "patch", "hvjob", "fixed-bounds", "-n", namespace, "--type=merge",
            "-p", json.dumps({"spec": {"elastic": patch}}), check=False,
        )  # fmt: skip
        assert proc.returncode != 0 and "cannot change while the job is started" in proc.stderr
    assert jobs.existing("fixed-bounds")["metadata"]["generation"] == 1
