"""What the kind e2e script (tests/e2e/kind/run.sh) calls, run here against the local
control plane: the examples' CPU variants, and the wait that decides pass or fail."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from localcluster.operator import OperatorProcess
from localcluster.paths import REPO
from localcluster.poll import wait_for
from tests.e2e.kind import kind_e2e
from tests.support.cluster import KubeCluster

EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_cpu_variant_of_every_example_is_accepted_by_the_server(
    cluster: KubeCluster, namespace: str, crd: None, example: Path
) -> None:
    printed = subprocess.run(
        [sys.executable, str(REPO / "tests/e2e/kind/kind_e2e.py"), "cpu-variant", str(example),
         "--image", "horovod-worker:e2e"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    documents = [d for d in yaml.safe_load_all(printed) if d]
    job = kind_e2e.horovod_job(documents)
    assert "nvidia.com/gpu" not in printed
    assert job["spec"]["image"] == "horovod-worker:e2e"
    # What the job uses (a script's ConfigMap, a claim) comes along.
    assert len(documents) == len([d for d in yaml.safe_load_all(example.read_text()) if d])
    proc = cluster.apply(yaml.safe_dump_all(documents), namespace, False, "--dry-run=server")
    assert proc.returncode == 0, proc.stderr


def test_a_claim_of_an_example_binds_to_the_volume_made_for_it(
    cluster: KubeCluster, namespace: str
) -> None:
    """The kind script's stand-in for a provisioner, checked by the real PV binder."""
    example = REPO / "examples" / "pytorch-digits-pvc.yaml"
    documents = [d for d in yaml.safe_load_all(example.read_text()) if d]
    claim = next(d for d in documents if d["kind"] == "PersistentVolumeClaim")
    [volume] = kind_e2e.volumes_for_claims(documents, storage_class="", namespace=namespace)
    assert volume["spec"]["hostPath"]["path"] == kind_e2e.volume_path(claim["metadata"]["name"])
    cluster.apply(volume)
    try:
        cluster.apply(claim, namespace)

        def bound() -> str | None:
            found = cluster.get("pvc", claim["metadata"]["name"], namespace)
            return (
                found["spec"].get("volumeName") if found["status"].get("phase") == "Bound" else None
            )

        assert wait_for(bound, 60, 0.5, "the claim to bind") == volume["metadata"]["name"]
    finally:
        cluster.kubectl("delete", "pv", volume["metadata"]["name"], "--wait=false", check=False)


@pytest.fixture
def operator(cluster: KubeCluster, namespace: str, crd: None, tmp_path: Path) -> Iterator[Path]:
    operator = OperatorProcess(cluster.kubeconfig, [namespace], tmp_path / "operator.log")
    operator.start_and_wait()
    try:
        yield operator.log_path
    finally:
        operator.stop()


def _wait_cli(
    cluster: KubeCluster, name: str, namespace: str, expect: str, timeout: int
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            str(REPO / "tests/e2e/kind/kind_e2e.py"),
            "wait",
            name,
            "--namespace",
            namespace,
            "--expect",
            expect,
            "--timeout",
            str(timeout),
        ],
        capture_output=True,
        text=True,
        env={**cluster.env},
        timeout=timeout + 30,
    )


def test_wait_passes_on_the_expected_phase_and_dumps_logs_otherwise(
    cluster: KubeCluster, namespace: str, operator: Path
) -> None:
    example = yaml.safe_load((REPO / "examples" / "pytorch-digits.yaml").read_text())
    job = kind_e2e.cpu_variant(example, "horovod-worker:e2e")
    name = job["metadata"]["name"]
    cluster.apply(job, namespace)

    def running_launcher() -> str | None:
        pods = cluster.get(
            "pods",
            namespace=namespace,
            selector=f"horovod.ai/job-name={name},horovod.ai/role=launcher",
        )
        running = [p for p in pods["items"] if p["status"].get("phase") == "Running"]
        return running[0]["metadata"]["name"] if running else None

    launcher = wait_for(running_launcher, 60, message=f"the launcher (log {operator})")
    # Not finished yet: a short wait fails and shows the user the job and its pods.
    early = _wait_cli(cluster, name, namespace, "Succeeded", 2)
    assert early.returncode == 1
    assert "expected Succeeded" in early.stderr and "kubectl get pods" in early.stderr
    cluster.set_pod_phase(namespace, launcher, "Succeeded")
    done = _wait_cli(cluster, name, namespace, "Succeeded", 60)
    assert done.returncode == 0, done.stderr
    wrong = _wait_cli(cluster, name, namespace, "Failed", 5)
    assert wrong.returncode == 1
