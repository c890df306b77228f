"""Fixtures for whole jobs run as local processes (localcluster.nodeagent).

`cluster` starts the local control plane once per run, in its own state dir and
ports (HVK_E2E_DIR, HVK_E2E_PORT_BASE; HVK_E2E_REUSE=<state dir> reuses one you
started with `hack/cluster.sh up`). `agent` starts the node agent on it: two
nodes, `local-0` and `local-1`, tainted so that only pods made by `local_pod`
(or jobs given `LOCAL_PLACEMENT`) land there, never on kwok's fake nodes.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from localcluster import crds
from localcluster.operator import OperatorProcess
from localcluster.paths import REPO
from localcluster.processes import stop_process
from tests.support.cluster import KubeCluster, fresh_namespace, session_cluster
from tests.support.nodeagent import AGENT, PYTHON, Agent


@pytest.fixture(scope="session")
def cluster() -> Iterator[KubeCluster]:
    with session_cluster("HVK_E2E", REPO / ".work" / "e2e-cluster", 17500) as started:
        yield started


@pytest.fixture(scope="session")
def agent(cluster: KubeCluster) -> Iterator[Agent]:
    state = Path(os.environ.get("HVK_E2E_AGENT_DIR", REPO / ".work" / "e2e-nodeagent"))
    state.mkdir(parents=True, exist_ok=True)
    build = subprocess.run([str(AGENT), "build"], capture_output=True, text=True, timeout=1800)
    if build.returncode != 0:
        pytest.fail(f"building CoreDNS failed:\n{build.stderr}{build.stdout}")
    ready = state / "ready.json"
    ready.unlink(missing_ok=True)
    log_file = state / "agent.log"
    with open(log_file, "ab") as out:
        proc = subprocess.Popen(
            [
                str(AGENT),
                "--state-dir",
                str(state),
                "run",
                "--kubeconfig",
                str(cluster.kubeconfig),
                "--nodes",
                "2",
                "--gpus",
                "2",
                "--ready-file",
                str(ready),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    handle = Agent(state, log_file, proc)
    deadline = time.monotonic() + 120
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"the node agent did not start:\n{handle.log_tail()}")
        time.sleep(0.3)
    try:
        yield handle
    finally:
        stop_process(proc, timeout=60)
        leftover = handle.netns()
        assert not leftover, f"the agent left network namespaces behind: {leftover}"


@pytest.fixture(scope="session")
def operator_process(cluster: KubeCluster, agent: Agent) -> Iterator[OperatorProcess]:
    """The CRD installed and the operator running (its /metrics for tests that count)."""
    cluster.kubectl("apply", "-f", str(REPO / "crds"))
    crds.wait_established(cluster.kubectl, [crds.HOROVODJOBS])
    operator = OperatorProcess(
        cluster.kubeconfig, [], agent.state_dir / "operator.log", python=str(PYTHON)
    )
    operator.start_and_wait(timeout=60)
    try:
        yield operator
    finally:
        operator.stop(timeout=30)


@pytest.fixture(scope="session")
def operator(operator_process: OperatorProcess) -> Path:
    """The operator running; its log file."""
    return operator_process.log_path


@pytest.fixture
def namespace(cluster: KubeCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    with fresh_namespace(cluster, request.node.name) as name:
        yield name


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed test shows the agent's log (the control plane's: tests/support/fixtures.py)."""
    report = yield
    agent = getattr(item, "funcargs", {}).get("agent")
    if report.failed and isinstance(agent, Agent):
        report.sections.append(("node agent log (last lines)", agent.log_tail()))
    return report
