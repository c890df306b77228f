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
TRAINER_API = "trainer.kubeflow.org/v1alpha1"
TRAINJOB_PLURAL = "trainjobs"
# The ClusterTrainingRuntime the bench's TrainJobs use (trainer_runtime()).
TRAINER_RUNTIME = "horovod-bench-mpi"
# Marks the replicated job that runs spec.trainer (the launcher, for MPI).
TRAINER_ANCESTOR = "trainer.kubeflow.org/trainjob-ancestor-step"

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


def launcher_command(workers: int) -> list[str]:
    """horovodrun over the hostfile the peers mount at /etc/mpi (mpi-operator, Trainer)."""
    return ["horovodrun", "-np", str(workers), "--hostfile", "/etc/mpi/hostfile", *COMMAND]


def mpi_job(
    name: str, workers: int, clean_pod_policy: str = "Running", gang: str | None = None
) -> Obj:
    """An MPIJob (kubeflow.org/v2beta1) equal to :func:`horovod_job`.

    The launcher runs `horovodrun -np <workers>` with the same per-rank command;
    workers run sshd, as mpi-operator's own Horovod example does. `gang` (for an
    mpi-operator run with --gang-scheduling): the group is the workers, as ours, since
    the launcher is created once they are Ready (mpi-operator's default minMember
    counts the launcher, and that group never fits); Volcano's Queue is `default`.
    """
    run_policy: Obj = {"backoffLimit": 0, "cleanPodPolicy": clean_pod_policy}
    if gang is not None:
        policy: Obj = {"minAvailable": workers}
        if gang == "Volcano":
            policy["queue"] = "default"
        run_policy["schedulingPolicy"] = policy
    return {
        "apiVersion": MPIJOB_API,
        "kind": "MPIJob",
        "metadata": {"name": name},
        "spec": {
            "slotsPerWorker": 1,
            "launcherCreationPolicy": "WaitForWorkersReady",
            "runPolicy": run_policy,
            "mpiReplicaSpecs": {
                "Launcher": {
                    "replicas": 1,
                    "template": {
                        "spec": {
                            "containers": [
                                {
                                    "name": "launcher",
                                    "image": IMAGE,
                                    "command": launcher_command(workers),
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


def trainer_runtime() -> Obj:
    """Kubeflow Trainer v2's MPI runtime in the shape of its own deepspeed-distributed
    one (manifests/base/runtimes), made equal to :func:`horovod_job`: N nodes that run
    sshd with one GPU each and a launcher that runs once every node is Ready
    (JobSet `dependsOn`: the counterpart of WaitForWorkersReady), OpenMPI with one
    process per node. `runLauncherAsNode: false`, so N nodes are N worker pods plus
    the launcher, as for the other operators; the job succeeds with its launcher."""
    node = {
        "name": "node",
        "image": IMAGE,
        "command": ["/usr/sbin/sshd", "-De"],
        "resources": {"limits": {GPU: 1}},
    }
    return {
        "apiVersion": TRAINER_API,
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": TRAINER_RUNTIME},
        "spec": {
            "mlPolicy": {
                "numNodes": 1,
                "mpi": {
                    "numProcPerNode": 1,
                    "mpiImplementation": "OpenMPI",
                    "sshAuthMountPath": "/root/.ssh",
                    "runLauncherAsNode": False,
                },
            },
            "template": {
                "spec": {
                    "network": {"publishNotReadyAddresses": True},
                    "successPolicy": {"operator": "All", "targetReplicatedJobs": ["launcher"]},
                    "replicatedJobs": [
                        {
                            "name": "node",
                            "template": {"spec": {"template": {"spec": {"containers": [node]}}}},
                        },
                        {
                            "name": "launcher",
                            "dependsOn": [{"name": "node", "status": "Ready"}],
                            "template": {
                                "metadata": {
                                    "labels": {
                                        "trainer.kubeflow.org/trainjob-ancestor-step": "trainer"
                                    }
                                },
                                "spec": {
                                    "template": {
                                        "spec": {"containers": [{"name": "node", "image": IMAGE}]}
                                    }
                                },
                            },
                        },
                    ],
                }
            },
        },
    }


def train_job(name: str, workers: int) -> Obj:
    """A TrainJob equal to :func:`horovod_job` on :func:`trainer_runtime`."""
    return {
        "apiVersion": TRAINER_API,
        "kind": "TrainJob",
        "metadata": {"name": name},
        "spec": {
            "runtimeRef": {"name": TRAINER_RUNTIME},
            "trainer": {
                "numNodes": workers,
                "image": IMAGE,
                "command": launcher_command(workers),
            },
        },
    }


def trainer_phase(obj: Obj) -> str | None:
    """A TrainJob has no phase and no Running condition: Complete or Failed only."""
    conditions = {
        c.get("type"): c.get("status") for c in (obj.get("status") or {}).get("conditions") or []
    }
    if conditions.get("Complete") == "True":
        return "Succeeded"
    if conditions.get("Failed") == "True":
        return "Failed"
    return None


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
    if "-node-" in pod_name:  # a TrainJob's: <job>-node-0-<index>-<hash> (JobSet, Indexed Job)
        return pod_name.rsplit("-node-", 1)[0], "worker"
    if "-launcher-" in pod_name:
        return pod_name.rsplit("-launcher-", 1)[0], "launcher"
    return None
