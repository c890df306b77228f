"""Equivalent jobs for both operators (pure: names and sizes in, dicts out).

Same image string, same per-rank command, same worker count, one slot and one
GPU per worker, launcher created once every worker is Ready, pods that are
still running deleted when the job finishes. kwok runs the pods, so the image
is never pulled; only the shape of the objects matters.
"""

from __future__ import annotations

from typing import Any

IMAGE = "example.org/horovod-worker:0.1"
COMMAND = ["python", "-m", "horovod_worker.train", "--framework=pytorch", "--synthetic"]
GPU = "nvidia.com/gpu"

HVJOB_API = "horovod.ai/v1alpha1"
HVJOB_PLURAL = "horovodjobs"
MPIJOB_API = "kubeflow.org/v2beta1"
MPIJOB_PLURAL = "mpijobs"

Obj = dict[str, Any]


def horovod_job(
    name: str,
    workers: int,
    clean_pod_policy: str = "Running",
    status: Obj | None = None,
    gang: str | None = None,
) -> Obj:
    """`gang`: spec.scheduling.gang.policy when given (default Auto: a native gang
    where the cluster serves PodGroups, as the bench cluster does)."""
    job: Obj = {
        "apiVersion": HVJOB_API,
        "kind": "HorovodJob",
        "metadata": {"name": name},
        "spec": {
            "image": IMAGE,
            "command": list(COMMAND),
            "slotsPerWorker": 1,
            "worker": {"replicas": workers, "resources": {"limits": {GPU: 1}}},
            "runPolicy": {
                "backoffLimit": 0,
                "cleanPodPolicy": clean_pod_policy,
                "launcherCreationPolicy": "WaitForWorkersReady",
            },
        },
    }
    if gang is not None:
        job["spec"]["scheduling"] = {"gang": {"policy": gang}}
    if status is not None:
        job["status"] = status
    return job


def mpi_job(name: str, workers: int, clean_pod_policy: str = "Running") -> Obj:
    """An MPIJob (kubeflow.org/v2beta1) equal to :func:`horovod_job`.

    The launcher runs `horovodrun -np <workers>` with the same per-rank command;
    workers run sshd, as mpi-operator's own Horovod example does.
    """
    return {
        "apiVersion": MPIJOB_API,
        "kind": "MPIJob",
        "metadata": {"name": name},
        "spec": {
            "slotsPerWorker": 1,
            "launcherCreationPolicy": "WaitForWorkersReady",
            "runPolicy": {"backoffLimit": 0, "cleanPodPolicy": clean_pod_policy},
            "mpiReplicaSpecs": {
                "Launcher": {
                    "replicas": 1,
                    "template": {
                        "spec": {
                            "containers": [
                                {
                                    "name": "launcher",
                                    "image": IMAGE,
                                    "command": [
                                        "horovodrun",
                                        "-np",
                                        str(workers),
                                        "--hostfile",
                                        "/etc/mpi/hostfile",
                                        *COMMAND,
                                    ],
                                }
                            ]
                        }
                    },
                },
                "Worker": {
                    "replicas": workers,
                    "template": {
                        "spec": {
                            "containers": [
                                {
                                    "name": "worker",
                                    "image": IMAGE,
                                    "command": ["/usr/sbin/sshd", "-De"],
                                    "resources": {"limits": {GPU: 1}},
                                }
                            ]
                        }
                    },
                },
            },
        },
    }


def finished_horovod_status(now: str) -> Obj:
    """The status our operator writes on a job whose launcher succeeded."""
    return {
        "phase": "Succeeded",
        "conditions": [
            {
                "type": "Succeeded",
                "status": "True",
                "reason": "LauncherSucceeded",
                "message": "the launcher exited 0",
                "lastTransitionTime": now,
            }
        ],
        "startTime": now,
        "completionTime": now,
        "restarts": 0,
    }


def finished_mpi_status(now: str) -> Obj:
    """The status mpi-operator writes on an MPIJob whose launcher succeeded."""
    conditions = [
        {
            "type": t,
            "status": s,
            "reason": r,
            "message": "",
            "lastTransitionTime": now,
            "lastUpdateTime": now,
        }
        for t, s, r in (
            ("Created", "True", "MPIJobCreated"),
            ("Running", "False", "MPIJobSucceeded"),
            ("Succeeded", "True", "MPIJobSucceeded"),
        )
    ]
    return {
        "conditions": conditions,
        "startTime": now,
        "completionTime": now,
        "replicaStatuses": {"Launcher": {"succeeded": 1}, "Worker": {}},
    }


def horovod_phase(obj: Obj) -> str | None:
    phase = (obj.get("status") or {}).get("phase")
    return str(phase) if phase else None


def mpi_phase(obj: Obj) -> str | None:
    """mpi-operator has no phase; its conditions map onto ours."""
    conditions = {
        c.get("type"): c.get("status") for c in (obj.get("status") or {}).get("conditions") or []
    }
    for kind in ("Succeeded", "Failed", "Running"):
        if conditions.get(kind) == "True":
            return kind
    if conditions.get("Created") == "True":
        return "Pending"
    return None


def pod_role(pod_name: str) -> tuple[str, str] | None:
    """(job name, role) of a pod either operator made; both name them the same way.

    Workers: `<job>-worker-<i>`; launcher pods (made by the launcher Job): `<job>-launcher-<hash>`.
    """
    if "-worker-" in pod_name:
        return pod_name.rsplit("-worker-", 1)[0], "worker"
    if "-launcher-" in pod_name:
        return pod_name.rsplit("-launcher-", 1)[0], "launcher"
    return None
