"""Fixtures for tests against the real local control plane (hack/cluster.py).

The session fixture `cluster` starts etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and kwok once per test run, in their own state directory and on
their own ports (so a demo cluster can keep running beside them), and tears them
down at the end even when tests fail. Set HVK_TEST_REUSE=<state dir> to run the
tests against a cluster you already started with `hack/cluster.sh up`;
HVK_TEST_DIR and HVK_TEST_PORT_BASE choose the state dir and ports of the one
the fixture starts.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import cluster as localcluster
import pytest
from clusterlib import KubeCluster, wait_for

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def cluster() -> Iterator[KubeCluster]:
    reuse = os.environ.get("HVK_TEST_REUSE")
    if reuse:
        layout = localcluster.Layout.load(Path(reuse))
        impl = localcluster.Cluster(layout)
        if not impl.status()["apiserver_ready"]:
            pytest.fail(f"HVK_TEST_REUSE={reuse}: no ready cluster there (hack/cluster.sh up)")
        yield KubeCluster(impl)
        return
    layout = localcluster.Layout(
        root=Path(os.environ.get("HVK_TEST_DIR", REPO / ".work" / "test-cluster")),
        port_base=int(os.environ.get("HVK_TEST_PORT_BASE", 17400)),
    )
    impl = localcluster.Cluster(layout)
    impl.down(quiet=True)  # what a crashed earlier run left
    localcluster.build()
    try:
        impl.up()
    except localcluster.ClusterError as exc:
        pytest.fail(f"the local control plane did not start: {exc}")
    try:
        yield KubeCluster(impl)
    finally:
        impl.down(quiet=True)


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[:40].strip("-")


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
    cluster.kubectl(
        "wait", "--for=condition=Established", "crd/horovodjobs.horovod.ai", "--timeout=60s"
    )


@pytest.fixture
def namespace(cluster: KubeCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace for one test, with its default ServiceAccount in place."""
    name = f"{_slug(request.node.name)}-{uuid.uuid4().hex[:5]}"
    cluster.kubectl("create", "namespace", name)
    # Pods are refused until the ServiceAccount controller made "default".
    wait_for(
        lambda: cluster.exists("serviceaccount", "default", name),
        30,
        message=f"serviceaccount default in {name}",
    )
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.failed and "cluster" in getattr(item, "fixturenames", ()):
        fixture = item.funcargs.get("cluster") if hasattr(item, "funcargs") else None
        if isinstance(fixture, KubeCluster):
            report.sections.append(("control plane logs (last lines)", fixture.log_tails()))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/integration" in str(item.fspath):
            item.add_marker(pytest.mark.integration)
