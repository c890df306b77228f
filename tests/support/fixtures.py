"""Fixtures for tests against the real local control plane (localcluster), for
every test under tests/ (registered by tests/conftest.py; tests/e2e overrides
`cluster` and `namespace` with its own control plane).

The session fixture `cluster` starts etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and kwok once per test run, in their own state directory and on
their own ports (so a demo cluster can keep running beside them), and tears them
down at the end even when tests fail. Set HVK_TEST_REUSE=<state dir> to run the
tests against a cluster you already started with `hack/cluster.sh up`;
HVK_TEST_DIR and HVK_TEST_PORT_BASE choose the state dir and ports of the one
the fixture starts.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from localcluster import crds
from localcluster.paths import REPO
from localcluster.poll import wait_for
from tests.support.cluster import KubeCluster, fresh_namespace, session_cluster
from tests.support.operator import Jobs, Operator


@pytest.fixture(scope="session")
def cluster() -> Iterator[KubeCluster]:
    with session_cluster("HVK_TEST", REPO / ".work" / "test-cluster", 17400) as started:
        yield started


@pytest.fixture(scope="session")
def crd(cluster: KubeCluster) -> None:
    """The HorovodJob CRD from crds/, established."""
    cluster.kubectl(
        "apply",
        "--server-side",
        "--force-conflicts",
        "-f",
        str(REPO / "crds" / "horovod.ai_horovodjobs.yaml"),
    )
    crds.wait_established(cluster.kubectl, [crds.HOROVODJOBS])
    garbage_collector_knows_horovodjobs(cluster)


def garbage_collector_knows_horovodjobs(cluster: KubeCluster) -> None:
    """Wait until kube-controller-manager's garbage collector removes what a deleted
    HorovodJob owned. It learns of a new CRD only at its next discovery round (about
    30 s): a test that deletes a job in the first minute of a fresh cluster and waits
    for its children to go raced that round (delete-and-reapply did, run alone)."""
    probe = {
        "apiVersion": "horovod.ai/v1alpha1",
        "kind": "HorovodJob",
        "metadata": {"name": "gc-probe"},
        "spec": {"image": "none", "command": ["true"], "worker": {"replicas": 1}},
    }
    with fresh_namespace(cluster, "gc-probe") as namespace:
        cluster.apply(probe, namespace)
        uid = cluster.get("hj", "gc-probe", namespace)["metadata"]["uid"]
        owned = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": "gc-probe-owned",
                "ownerReferences": [
                    {"apiVersion": "horovod.ai/v1alpha1", "kind": "HorovodJob",
                     "name": "gc-probe", "uid": uid}
                ],
            },
        }  # fmt: skip
        cluster.apply(owned, namespace)
        cluster.kubectl("delete", "hj", "gc-probe", "-n", namespace, "--wait=false")
        wait_for(
            lambda: not cluster.exists("configmap", "gc-probe-owned", namespace),
            120, 0.5, "the garbage collector to remove what a deleted HorovodJob owned",
        )  # fmt: skip


@pytest.fixture
def namespace(cluster: KubeCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace for one test."""
    with fresh_namespace(cluster, request.node.name) as name:
        yield name


@pytest.fixture
def operator(cluster: KubeCluster, namespace: str, crd: None, tmp_path: Path) -> Iterator[Operator]:
    """The operator as a subprocess watching the test's namespace."""
    op = Operator(cluster, namespace, tmp_path / "operator.log")
    op.start()
    try:
        yield op
    finally:
        op.stop()
        print(f"--- operator log ({op.log_path}) ---\n{op.log_tail(200)}")


@pytest.fixture
def jobs(cluster: KubeCluster, namespace: str, operator: Operator) -> Jobs:
    return Jobs(cluster, namespace, operator)


@pytest.fixture
def ghost_node(cluster: KubeCluster, namespace: str) -> Iterator[str]:
    """A Node object no kubelet (or kwok) manages: the test plays its kubelet."""
    name = f"ghost-{namespace}"[:63]
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}
    cluster.apply(node)
    try:
        yield name
    finally:
        cluster.kubectl("delete", "node", name, "--wait=false", check=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed test that used a control plane (this one or tests/e2e's) shows its logs."""
    report = yield
    if report.failed:
        fixture = getattr(item, "funcargs", {}).get("cluster")
        if isinstance(fixture, KubeCluster):
            report.sections.append(("control plane logs (last lines)", fixture.log_tails()))
    return report
