"""An MPIJob written for kubeflow/mpi-operator, converted by `hvjob convert` and run.

The MPIJob (tests/testdata/mpijob-horovod.yaml) has the shape of mpi-operator's
Horovod examples: workers that run the image's own sshd (`/usr/sbin/sshd -De`)
as root, keys expected at sshAuthMountPath (/root/.ssh), and the program after
mpirun's usual Open MPI options. The converted HorovodJob keeps all three:
spec.ssh.authMountPath mounts the job's keys the way mpi-operator does, the
workers' command stays theirs, and the mpirun options reach mpirun through
horovodrun's --binding-args/--mpi-args (spec.launcher.horovodrunArgs), after the
-np and hostfile the operator writes.

One change for this rung: the example's program, /examples/tensorflow_mnist.py,
lives in mpi-operator's image and downloads MNIST, and this rung runs host
processes with no internet; the digits trainer stands in for it. Everything
else (the host's own sshd and Open MPI standing in for the image's) is as the
MPIJob wrote it.
"""

from __future__ import annotations

import copy
import io
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import yaml

from horovod_operator.sdk.cli import main as hvjob
from localcluster.paths import REPO
from localcluster.poll import wait_for
from tests.e2e.test_gloo import processes
from tests.e2e.test_horovodjob import ACCURACY_BAR, ranks, result, wait_finished
from tests.support.cluster import KubeCluster
from tests.support.nodeagent import LOCAL_PLACEMENT, Agent

MPIJOB = REPO / "tests" / "testdata" / "mpijob-horovod.yaml"
PROGRAM = ["python", "-m", "horovod_worker.train", "--framework=pytorch", "--threads=1"]


def converted() -> tuple[dict[str, Any], str]:
    """`hvjob convert` of the MPIJob: the HorovodJob and the warnings printed."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        assert hvjob(["convert", str(MPIJOB)]) == 0, err.getvalue()
    job: dict[str, Any] = yaml.safe_load(out.getvalue())
    return job, err.getvalue()


# What mpi-operator's base image writes into its /etc/ssh/ssh_config (its
# examples/base/Dockerfile): no host key checking, no known_hosts to write, since
# ~/.ssh is a read-only Secret. The host's ssh config stands in for the image's
# here, so the pods get these lines as a drop-in the host's ssh_config includes.
IMAGE_SSH_CONFIG = "Host *\n    StrictHostKeyChecking no\n    UserKnownHostsFile /dev/null\n"
SSH_CONFIG_D = "/etc/ssh/ssh_config.d"


def image_sshd_ready() -> None:
    """What the image's Dockerfile does for its sshd (`mkdir -p /var/run/sshd`): the
    host's sshd stands in for it, and without a running sshd service nothing has made
    its privilege separation directory (the workers' sshd exits 255 naming it).
    Before this, the test passed only after a test whose workers ran our own sshd
    wrapper, which makes it."""
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)


def on_this_rung(job: dict[str, Any]) -> dict[str, Any]:
    """The job placed on the agent's nodes, with the stand-in program and the
    image's ssh client settings."""
    job = copy.deepcopy(job)
    spec = job["spec"]
    assert spec["command"] == ["python", "/examples/tensorflow_mnist.py"]
    spec["command"] = PROGRAM
    for role, container_name in ((spec["worker"], "worker"), (spec["launcher"], "launcher")):
        pod: dict[str, Any] = role.setdefault("template", {}).setdefault("spec", {})
        pod.update(copy.deepcopy(LOCAL_PLACEMENT))
        pod.setdefault("volumes", []).append(
            {"name": "image-ssh-config", "configMap": {"name": "image-ssh-config"}}
        )
        containers = pod.setdefault("containers", [{"name": container_name}])
        containers[0].setdefault("volumeMounts", []).append(
            {"name": "image-ssh-config", "mountPath": SSH_CONFIG_D, "readOnly": True}
        )
    return job


def test_an_mpi_operator_job_runs_converted_with_its_image_sshd(
    cluster: KubeCluster, agent: Agent, operator: Path, namespace: str
) -> None:
    job, warnings = converted()
    spec = job["spec"]
    assert spec["ssh"] == {"authMountPath": "/root/.ssh"}
    # -mca pml ob1 and -mca btl ^openib are horovodrun's own already: dropped.
    assert spec["launcher"]["horovodrunArgs"] == [
        "--binding-args=-bind-to none -map-by slot",
        "--mpi-args=-x LD_LIBRARY_PATH -x PATH",
    ]
    assert "image's own sshd" in warnings, warnings

    name = job["metadata"]["name"]
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "image-ssh-config"},
        "data": {"mpi-operator-image.conf": IMAGE_SSH_CONFIG},
    }
    cluster.apply(config_map, namespace)
    image_sshd_ready()
    cluster.apply(on_this_rung(job), namespace)

    def workers_serving() -> list[dict[str, Any]] | None:
        seen = [p for p in processes(agent, namespace) if p["pod"].startswith(f"{name}-worker")]
        both = {p["pod"] for p in seen} == {f"{name}-worker-0", f"{name}-worker-1"}
        # Until the node agent's pod init has exec'd the container's command, the
        # process is podinit.py: a cold run on a loaded machine sampled one there.
        started = not any("nodeagent/podinit.py" in p["cmd"] for p in seen)
        return seen if both and started else None

    workers = wait_for(workers_serving, 300, 0.5, "both workers' processes")
    # The image's sshd, not the operator's: mpi-operator's worker command ran.
    # (sshd retitles itself "sshd: /usr/sbin/sshd -De [listener] ...")
    assert all("/usr/sbin/sshd -De" in p["cmd"] for p in workers), workers
    assert not any("horovod_worker.sshd" in p["cmd"] for p in workers), workers
    # (cleanPodPolicy Running removes the workers at the end.)
    # The keys are where the image's ssh and sshd look, with mpi-operator's names.
    pod = cluster.get("pod", f"{name}-worker-0", namespace)
    mounts = {m["mountPath"]: m["name"] for m in pod["spec"]["containers"][0]["volumeMounts"]}
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == mounts["/root/.ssh"])
    assert [i["path"] for i in volume["secret"]["items"]] == [
        "id_rsa", "id_rsa.pub", "authorized_keys",
    ]  # fmt: skip

    finished = wait_finished(cluster, namespace, name, 600)
    launcher_log = agent.cli("logs", f"{name}-launcher", "-n", namespace, check=False)
    assert finished["status"]["phase"] == "Succeeded", launcher_log[-4000:]
    assert result(launcher_log)["test_accuracy"] >= ACCURACY_BAR
    assert [r["rank"] for r in ranks(launcher_log)] == [0, 1]
    launcher = cluster.get("job", f"{name}-launcher", namespace)
    command = launcher["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[:7] == ["horovodrun", "-np", "2", "--hostfile", command[4], "-p", "22"]
