"""Apply -> first step -> Succeeded with real pods, ours against kubeflow/mpi-operator.

One program, two operators, three job shapes, on the node agent
(bench/realpods.py says what is timed). mpi-operator v0.8.0 runs the MPIJob of
tests/testdata/mpijob-horovod.yaml as its users write it (workers run the
image's `sshd -De` as root, the launcher `mpirun ... python ...`), with
`launcherCreationPolicy: WaitForWorkersReady`: its default, AtStartup, starts
mpirun before the workers' names resolve, the race
its users report. Ours runs the program twice: as a HorovodJob of our own
(our sshd wrapper in the workers; in the launcher our ssh client and
horovod_worker.horovodrun), and as that MPIJob converted by `hvjob convert`
(the image's sshd as root, plain horovodrun, the image's ssh client settings,
test_mpijob_image.py). All place their pods on the agent's nodes and run the
stand-in program.

HVK_REALPODS_REPEATS=N runs each N times, alternating; HVK_REALPODS_OUT=path
writes the runs and the table there (`make bench-realpods`);
HVK_REALPODS_SHAPES=ours,ours-preloaded runs only those. Timings are
recorded, never asserted: a loaded machine would fail a timed test. What is
asserted is that every job succeeds with its ranks on the workers, and that
every milestone was seen, in order.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from bench import manifests, procs, realpods
from bench.run import operator_specs
from localcluster import crds
from localcluster.kube import Client
from localcluster.paths import WORK
from localcluster.poll import wait_for
from localcluster.processes import port_free, port_held
from tests.e2e.test_horovodjob import RANK_LINE
from tests.e2e.test_mpijob_image import (
    IMAGE_SSH_CONFIG,
    MPIJOB,
    PROGRAM,
    SSH_CONFIG_D,
    converted,
    image_sshd_ready,
    on_this_rung,
)
from tests.support.cluster import KubeCluster
from tests.support.nodeagent import LOCAL_PLACEMENT, PYTHON, Agent
from tests.support.prerequisites import skip_unless_ci
from tests.support.timings import record_timing

WORKERS = 2
LABELS = {
    "ours": "horovod-operator (its own sshd and launcher)",
    "ours-preloaded": "horovod-operator, ranks forked from a preloaded interpreter (HVJOB_PRELOAD)",
    "ours-converted": "horovod-operator, the MPIJob converted (image's sshd, plain horovodrun)",
    "mpi-operator": "mpi-operator v0.8.0 (WaitForWorkersReady, work queue unthrottled)",
}
JOB_PREFIX = {"ours": "hv", "ours-preloaded": "hvp", "ours-converted": "hvc", "mpi-operator": "mpi"}
# The part of "-> first step" that is the interpreter and framework loading.
IMPORTS = ("torch", "horovod.torch")
PRELOAD = ",".join(IMPORTS)


def mpi_job(name: str) -> dict[str, Any]:
    """The testdata MPIJob on this rung: placed on the agent's nodes, the stand-in
    program after its mpirun options, the image's ssh client settings mounted."""
    job: dict[str, Any] = yaml.safe_load(MPIJOB.read_text())
    job["metadata"] = {"name": name}
    job["spec"]["launcherCreationPolicy"] = "WaitForWorkersReady"
    replicas = job["spec"]["mpiReplicaSpecs"]
    args = replicas["Launcher"]["template"]["spec"]["containers"][0]["args"]
    assert args[-2:] == ["python", "/examples/tensorflow_mnist.py"], args
    args[-2:] = PROGRAM
    for role in ("Launcher", "Worker"):
        pod = replicas[role]["template"]["spec"]
        pod.update(copy.deepcopy(LOCAL_PLACEMENT))
        pod.setdefault("volumes", []).append(
            {"name": "image-ssh-config", "configMap": {"name": "image-ssh-config"}}
        )
        pod["containers"][0].setdefault("volumeMounts", []).append(
            {"name": "image-ssh-config", "mountPath": SSH_CONFIG_D, "readOnly": True}
        )
    return job


def converted_job(name: str) -> dict[str, Any]:
    """The MPIJob as `hvjob convert` writes it: the image's sshd as root, its keys
    at /root/.ssh, plain horovodrun."""
    job = on_this_rung(converted()[0])
    job["metadata"] = {"name": name}
    return job


def horovod_job(name: str) -> dict[str, Any]:
    """The same program as a HorovodJob of our own: the workers run our sshd
    wrapper, the launcher our ssh client and horovodrun (horovod_worker.horovodrun)."""
    job = converted_job(name)
    spec = job["spec"]
    del spec["ssh"]
    for role in (spec["worker"], spec["launcher"]):
        pod = role["template"]["spec"]
        pod["volumes"] = [v for v in pod["volumes"] if v["name"] != "image-ssh-config"]
        container = pod["containers"][0]
        container.pop("command", None)
        container.pop("args", None)
        container["volumeMounts"] = [
            m for m in container["volumeMounts"] if m["name"] != "image-ssh-config"
        ]
    return job


def preloaded_job(name: str) -> dict[str, Any]:
    """Our HorovodJob with HVJOB_PRELOAD on both roles: the workers import torch and
    Horovod while they wait, and the launcher's horovodrun starts each rank from them
    (horovod_worker.preload)."""
    job = horovod_job(name)
    for role in (job["spec"]["worker"], job["spec"]["launcher"]):
        container = role["template"]["spec"]["containers"][0]
        container.setdefault("env", []).append({"name": "HVJOB_PRELOAD", "value": PRELOAD})
    return job


@pytest.fixture
def mpi_operator(cluster: KubeCluster, agent: Agent, namespace: str) -> Iterator[None]:
    """mpi-operator v0.8.0 (built from its Go module, cached) watching the test's
    namespace, at its best: our client rate and its work queue unthrottled."""
    if not shutil.which("go"):
        skip_unless_ci("needs Go to build mpi-operator")
    procs.build_mpi_operator()
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(procs.mpi_crd()))
    crds.wait_established(cluster.kubectl, ["mpijobs.kubeflow.org"])
    (spec,) = operator_specs(50, 100, ["mpi-tuned"])  # our operator's default client rate
    process = procs.MpiOperatorProcess(
        spec, cluster.kubeconfig, namespace, agent.state_dir / f"mpi-operator-{namespace}.log"
    )
    # hack/test.sh's other stream may run mpi-operator (the quick benchmark) on the same
    # fixed port: wait for it rather than fail on a taken port.
    with port_held(procs.MPI_HEALTH_PORT):
        if not port_free(procs.MPI_HEALTH_PORT, "0.0.0.0"):
            pytest.fail(f"port {procs.MPI_HEALTH_PORT} (mpi-operator's /healthz) is taken")
        process.start_and_wait(timeout=60)
        try:
            yield
        finally:
            process.stop(timeout=30)


def _ranks_on_workers(log: str, name: str) -> list[tuple[int, str]]:
    found = sorted((int(m.group(1)), m.group(5)) for m in RANK_LINE.finditer(log))
    assert [rank for rank, _ in found] == list(range(WORKERS)), log[-3000:]
    assert all(host.startswith(f"{name}-worker-") for _, host in found), found
    return found


def _failure_report(
    cluster: KubeCluster, namespace: str, name: str, run: dict[str, Any], log: str
) -> str:
    """What a job that did not succeed leaves to read: its run, the launcher's log and
    each worker's (read before the job is deleted)."""
    parts = [f"{name} ended {run['phase']}: {json.dumps(run['milestones'])}"]
    parts += ["--- launcher log (last 6000 characters) ---", log[-6000:]]
    for i in range(WORKERS):
        pod = f"{name}-worker-{i}"
        worker = cluster.kubectl("logs", "--timestamps", pod, "-n", namespace, check=False)
        parts += [f"--- {pod} ---", (worker.stdout + worker.stderr)[-3000:]]
    return "\n".join(parts)


def _pods_gone(cluster: KubeCluster, namespace: str, name: str) -> bool:
    pods = cluster.get("pods", namespace=namespace)["items"]
    return not any(p["metadata"]["name"].startswith(f"{name}-") for p in pods)


def _timed_run(
    cluster: KubeCluster,
    client: Client,
    namespace: str,
    path: str,
    job: dict[str, Any],
    phase_of: Callable[[dict[str, Any]], str | None],
) -> dict[str, Any]:
    """One job timed to the end (bench.realpods.run_one), checked, then deleted."""
    name = job["metadata"]["name"]
    logs: list[str] = []

    def launcher_log(pod: str) -> str:
        logs.append(cluster.kubectl("logs", "--timestamps", pod, "-n", namespace).stdout)
        return logs[-1]

    def finished(obj: dict[str, Any]) -> str | None:
        phase = phase_of(obj)
        return phase if phase in ("Succeeded", "Failed") else None

    run = realpods.run_one(client, namespace, path, job, WORKERS, finished, launcher_log)
    log = logs[-1] if logs else ""
    if run["phase"] != "Succeeded":
        # A plain string: pytest shortens a long repr to its two ends, which hid the
        # launcher's mpirun message and every worker's log (the preloader's lines).
        pytest.fail(_failure_report(cluster, namespace, name, run, log), pytrace=False)
    _ranks_on_workers(log, name)
    if PRELOAD in str(job):
        # Every rank came from the preloader: a client that started its own interpreter
        # would have said why in the launcher's log.
        assert "horovod_worker.preload" not in log, log[-3000:]
    marks = [run["milestones"][m] for m in realpods.MILESTONES]
    assert all(m is not None for m in marks), (name, run)
    assert marks == sorted(marks), (name, run)
    cluster.kubectl("delete", path.rsplit("/", 1)[1], name, "-n", namespace)
    wait_for(
        functools.partial(_pods_gone, cluster, namespace, name),
        120,
        1.0,
        f"the pods of {name} to be gone",
    )
    return run


# Its own run is about 6 minutes cold; it may first wait for the quick benchmark (the
# other stream of hack/test.sh) to give mpi-operator's fixed port back.
@pytest.mark.timeout(1500)
def test_apply_to_first_step_ours_and_mpi_operators(
    cluster: KubeCluster, agent: Agent, operator: Path, mpi_operator: None, namespace: str
) -> None:
    image_sshd_ready()
    client = Client(cluster.kubeconfig)
    repeats = int(os.environ.get("HVK_REALPODS_REPEATS", "1"))
    cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "image-ssh-config"},
            "data": {"mpi-operator-image.conf": IMAGE_SSH_CONFIG},
        },
        namespace,
    )
    shapes = {
        "ours": (
            f"/apis/{manifests.HVJOB_API}/namespaces/{namespace}/{manifests.HVJOB_PLURAL}",
            horovod_job,
            manifests.horovod_phase,
        ),
        "ours-preloaded": (
            f"/apis/{manifests.HVJOB_API}/namespaces/{namespace}/{manifests.HVJOB_PLURAL}",
            preloaded_job,
            manifests.horovod_phase,
        ),
        "ours-converted": (
            f"/apis/{manifests.HVJOB_API}/namespaces/{namespace}/{manifests.HVJOB_PLURAL}",
            converted_job,
            manifests.horovod_phase,
        ),
        "mpi-operator": (
            f"/apis/{manifests.MPIJOB_API}/namespaces/{namespace}/{manifests.MPIJOB_PLURAL}",
            mpi_job,
            manifests.mpi_phase,
        ),
    }

    only = [k for k in os.environ.get("HVK_REALPODS_SHAPES", "").split(",") if k]
    if only:  # a local rerun of some shapes; CI runs them all
        unknown = sorted(set(only) - set(shapes))
        assert not unknown, f"HVK_REALPODS_SHAPES: no shape {unknown}; shapes: {list(shapes)}"
        shapes = {key: shapes[key] for key in only}
    runs: dict[str, list[dict[str, Any]]] = {key: [] for key in shapes}
    try:
        for i in range(repeats):
            for key, (path, make, phase_of) in shapes.items():
                name = f"{JOB_PREFIX[key]}-digits-{i}"
                run = _timed_run(cluster, client, namespace, path, make(name), phase_of)
                record_timing("realpods", f"{key}-{i}", **run["milestones"])
                runs[key].append(run)
    finally:
        client.close()
    imports = realpods.import_seconds(str(PYTHON), IMPORTS)
    text = realpods.table(runs, LABELS)
    print(f"\n{text}\n(import {' + '.join(IMPORTS)}: {imports:.2f} s per interpreter)")
    out = os.environ.get("HVK_REALPODS_OUT")
    written = Path(out) if out else WORK / "timings" / "realpods-runs.json"
    written.parent.mkdir(parents=True, exist_ok=True)
    written.write_text(
        json.dumps(
            {
                "runs": runs,
                "median": realpods.summary(runs),
                "import_seconds": imports,
                "imports": list(IMPORTS),
                "workers": WORKERS,
                "python": sys.version.split()[0],
                "table": text,
            },
            indent=2,
            sort_keys=True,
        )
        + "\n"
    )
