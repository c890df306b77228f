"""The operator image against the real control plane.

hack/images.sh starts a Docker engine (the session fixture `docker` of
tests/support/docker.py: a daemon it started is stopped at the end, one that was
running already is left alone) and builds Dockerfile.operator. The image then
runs as the chart runs it, as a container on the host network: its own non-root
user, a read-only root filesystem, no capabilities, the test cluster's
kubeconfig mounted read-only. It drives a
HorovodJob to Succeeded on kwok's nodes, as test_operator_core's subprocess does.

Where no Docker engine can be had (no root to install or start one), the test
is skipped on a developer's machine and fails under CI=1.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.support.cluster import KubeCluster
from tests.support.docker import images, inspect_image
from tests.support.operator import Jobs, Operator, condition, hvjob


@dataclass
class Image:
    name: str
    user: str
    labels: dict[str, str]


@pytest.fixture(scope="session")
def operator_image(docker: str) -> Image:
    """horovod-operator:<version>, built by hack/images.sh operator."""
    built = images("operator")
    assert built.returncode == 0, f"hack/images.sh operator failed:\n{built.stderr[-4000:]}"
    name = f"horovod-operator:{images('version').stdout.strip()}"
    config = inspect_image(docker, name)["Config"]
    return Image(name, config["User"], config["Labels"] or {})


class ContainerOperator(Operator):
    """The operator as `docker run` of the image, in the foreground: its output is the
    log file, and SIGTERM to the CLI reaches the container (docker's --sig-proxy)."""

    def __init__(
        self,
        cluster: KubeCluster,
        namespace: str,
        log_path: Path,
        docker: str,
        image: Image,
        kubeconfig_dir: Path,
    ) -> None:
        super().__init__(cluster, namespace, log_path)
        self.docker = docker
        self.image = image
        self.kubeconfig_dir = kubeconfig_dir
        self.container = f"hvk-operator-{uuid.uuid4().hex[:8]}"

    def docker_run(self, *args: str, name: str | None = None) -> list[str]:
        return [
            self.docker,
            "run",
            "--rm",
            *(["--name", name] if name else []),
            "--network=host",
            "--read-only",
            f"--user={self.image.user}",
            "--cap-drop=ALL",
            "--security-opt=no-new-privileges",
            "--volume",
            f"{self.kubeconfig_dir}:/kube:ro",
            *args,
        ]

    def start(self) -> None:
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            self.docker_run(
                self.image.name,
                "--namespace",
                self.namespace,
                "--kubeconfig",
                "/kube/config",
                "--http-port",
                str(self.port),
                *self.extra_args,
                name=self.container,
            ),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()

    def stop(self, timeout: float = 20) -> None:
        super().stop(timeout)
        subprocess.run(
            [self.docker, "rm", "--force", self.container], capture_output=True, timeout=60
        )


def container_kubeconfig(cluster: KubeCluster, into: Path) -> Path:
    """The cluster's kubeconfig for the container, at /kube/config: the certificates
    and key it names by host paths (root's only) copied beside it, readable by the
    image's user, and named by their paths in the container. (Inline data would do
    too, but the client writes it to temporary files: a writable /tmp just for that.)"""
    into.mkdir(mode=0o755)
    config = yaml.safe_load(cluster.kubeconfig.read_text())
    entries = [c["cluster"] for c in config["clusters"]] + [u["user"] for u in config["users"]]
    for entry in entries:
        for key in ("certificate-authority", "client-certificate", "client-key"):
            if key in entry:
                source = Path(entry[key])
                (into / source.name).write_bytes(source.read_bytes())
                (into / source.name).chmod(0o644)
                entry[key] = f"/kube/{source.name}"
    (into / "config").write_text(yaml.safe_dump(config))
    (into / "config").chmod(0o644)
    return into


IMAGE_PROBE = """\
import asyncio, importlib.util
from horovod_operator import transport
from horovod_operator.connection import load_connection
assert importlib.util.find_spec("kubernetes") is None, "the SDK's client is in the image"
async def version():
    c = load_connection("/kube/config")
    async with transport.new_session(transport.ssl_context(c)) as session:
        async with session.get(c.server + "/version", headers=transport.headers(c)) as r:
            return (await r.json())["gitVersion"]
print(asyncio.run(version()))
"""


def test_operator_image_reconciles_a_job_to_succeeded(
    cluster: KubeCluster,
    crd: None,
    namespace: str,
    docker: str,
    operator_image: Image,
    tmp_path: Path,
) -> None:
    version = images("version").stdout.strip()
    assert operator_image.labels["org.opencontainers.image.version"] == version
    assert operator_image.user.split(":")[0] not in ("", "0", "root"), operator_image.user

    kube_dir = container_kubeconfig(cluster, tmp_path / "kube")
    server = yaml.safe_load((kube_dir / "config").read_text())["clusters"][0]["cluster"]["server"]
    op = ContainerOperator(
        cluster, namespace, tmp_path / "operator.log", docker, operator_image, kube_dir
    )
    # The server address (the host's loopback) answers from a host-network
    # container, through the operator's own credentials and TLS, before the operator
    # is blamed. The image has no kubernetes package: that is the SDK's.
    probe = subprocess.run(
        op.docker_run(
            "--entrypoint",
            "python",
            operator_image.name,
            "-c",
            IMAGE_PROBE,
        ),
        capture_output=True,
        text=True,
        timeout=120,
    )
    expected = json.loads(cluster.kubectl("version", "-o", "json").stdout)["serverVersion"]
    assert probe.returncode == 0, f"{server} from the container:\n{probe.stderr[-3000:]}"
    assert probe.stdout.strip() == expected["gitVersion"]

    op.start()
    try:
        jobs = Jobs(cluster, namespace, op)
        jobs.apply(hvjob("mnist", replicas=2))
        launcher = jobs.wait_running("mnist", timeout=90)
        assert len(jobs.ready_workers("mnist")) == 2

        # The operator process (the container's first) runs as the image's user, on a
        # read-only root with nothing writable mounted.
        state = json.loads(
            subprocess.run(
                [docker, "inspect", op.container], capture_output=True, text=True, check=True
            ).stdout
        )[0]
        proc_status = Path(f"/proc/{state['State']['Pid']}/status").read_text()
        assert "horovod_operator" in Path(f"/proc/{state['State']['Pid']}/cmdline").read_text()
        uids = next(
            line.split()[1:] for line in proc_status.splitlines() if line.startswith("Uid:")
        )
        assert set(uids) == {operator_image.user.split(":")[0]}, proc_status
        assert state["HostConfig"]["ReadonlyRootfs"] is True
        assert state["HostConfig"].get("Tmpfs") in (None, {})
        assert [m["Destination"] for m in state["Mounts"] if m["RW"]] == []

        cluster.set_pod_phase(namespace, launcher, "Succeeded")
        status = jobs.wait_phase("mnist", "Succeeded")
        assert condition(status, "Succeeded")["reason"] == "LauncherSucceeded"
        op.wait(lambda: jobs.pods("mnist") == [], 20, "workers deleted")
        assert op.requests("POST", "Pod") >= 2, op.metrics()[-2000:]

        # SIGTERM, as the kubelet sends it, ends the operator (PID 1 in the container).
        op.stop()
        assert op.proc is not None and op.proc.returncode == 0, op.log_tail()
    finally:
        op.stop()
        print(f"--- operator container log ({op.log_path}) ---\n{op.log_tail(200)}")
