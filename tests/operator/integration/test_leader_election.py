"""Two replicas with --leader-elect against a real API server that writes an audit
log: one actor at a time, proven by the log of every write the API server took;
and, in the same control plane of its own, an operator started on an older CRD.

Its own control plane (an audited one; the suite's shared cluster writes no audit
log). Each replica's requests carry its identity in their User-Agent
(`horovod-operator (<host>-<pid>-<id>)`), so the log says which replica wrote what.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from horovod_operator.leader import LEASE_DURATION
from localcluster import crds
from localcluster.paths import REPO
from localcluster.poll import wait_for
from tests.support.cluster import KubeCluster, fresh_namespace, session_cluster
from tests.support.operator import Jobs, Operator, hvjob

WRITES = frozenset({"create", "update", "patch", "delete", "deletecollection"})


@pytest.fixture(scope="module")
def audited() -> Iterator[KubeCluster]:
    with session_cluster(
        "HVK_LEADER", REPO / ".work" / "leader-cluster", 17800, audit=True
    ) as started:
        started.kubectl(
            "apply", "--server-side", "-f", str(REPO / "crds" / "horovod.ai_horovodjobs.yaml")
        )
        crds.wait_established(started.kubectl, [crds.HOROVODJOBS])
        started.add_kwok_nodes(2, 8)
        started.wait_nodes_ready()
        yield started


@pytest.fixture
def ns(audited: KubeCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    with fresh_namespace(audited, request.node.name) as name:
        yield name


def _holder(cluster: KubeCluster, namespace: str) -> str:
    proc = cluster.kubectl("get", "lease", "op", "-n", namespace, "-o", "json", check=False)
    return (
        str(json.loads(proc.stdout)["spec"].get("holderIdentity") or "")
        if not proc.returncode
        else ""
    )


def _replicas(
    cluster: KubeCluster, namespace: str, tmp_path: Path, qps: int
) -> tuple[Operator, Operator]:
    args = ["--leader-elect", "--leader-election-namespace", namespace]
    args += ["--leader-election-id", "op", "--qps", str(qps), "--burst", str(qps)]
    replicas = [Operator(cluster, namespace, tmp_path / f"op-{i}.log") for i in range(2)]
    for op in replicas:
        op.extra_args = args
        op.start()
    try:
        holder = replicas[0].wait(lambda: _holder(cluster, namespace), 30, "a leader")
    except BaseException:
        for op in replicas:  # no leader: the test ends here, and so do they
            op.stop()
        raise
    leader = next(op for op in replicas if f"-{op.pid}-" in holder)
    standby = next(op for op in replicas if op is not leader)
    return leader, standby


def _writes(cluster: KubeCluster, namespace: str) -> list[tuple[datetime, str, str]]:
    """(time the API server received it, the writer's pid, `verb resource`) of every
    write request in `namespace` by an operator replica, Leases (the election itself)
    aside; refused ones too (a 409 proves a request was sent, and so an act)."""
    found = []
    log = cluster.layout.logs / "audit.log"
    for line in log.read_text().splitlines():
        event: dict[str, Any] = json.loads(line)
        agent = event.get("userAgent") or ""
        ref = event.get("objectRef") or {}
        if not agent.startswith("horovod-operator (") or event.get("verb") not in WRITES:
            continue
        if ref.get("namespace") != namespace or ref.get("resource") == "leases":
            continue
        pid = agent.split("(", 1)[1].rstrip(")").split("-")[-2]
        at = datetime.fromisoformat(event["requestReceivedTimestamp"].replace("Z", "+00:00"))
        found.append((at, pid, f"{event['verb']} {ref.get('resource')}"))
    return sorted(found)


def _writes_once_seen(
    cluster: KubeCluster, namespace: str, pid: int
) -> list[tuple[datetime, str, str]]:
    """The writes, once the audit log shows one of `pid`'s. The API server writes its
    log in batches: a fixed 1.5 s wait for them failed a CI run (2026-12-06) whose
    machine was busy, with the new leader's writes not in the file yet."""

    def seen() -> list[tuple[datetime, str, str]] | None:
        writes = _writes(cluster, namespace)
        return writes if any(p == str(pid) for _, p, _ in writes) else None

    return wait_for(seen, 30, 0.5, f"a write of pid {pid} in the audit log")


def _settled_writes(cluster: KubeCluster, namespace: str) -> list[tuple[datetime, str, str]]:
    """The writes once two reads of the audit log a second apart agree (it is written in
    batches)."""
    last: list[list[tuple[datetime, str, str]]] = [[]]

    def same() -> list[tuple[datetime, str, str]] | None:
        writes = _writes(cluster, namespace)
        settled = writes if writes and writes == last[0] else None
        last[0] = writes
        return settled

    return wait_for(same, 30, 1.0, "the audit log to settle")


def _one_writer_at_a_time(writes: list[tuple[datetime, str, str]], first: int, then: int) -> None:
    """Every write of `first` came before every write of `then`, and nobody else wrote."""
    assert {pid for _, pid, _ in writes} <= {str(first), str(then)}, writes
    last_first = max((at for at, pid, _ in writes if pid == str(first)), default=None)
    first_then = min((at for at, pid, _ in writes if pid == str(then)), default=None)
    assert last_first is not None and first_then is not None, writes
    assert last_first < first_then, (
        f"the old leader wrote at {last_first} after the new one began at {first_then}"
    )


def _finishes_with_one_of_each(jobs: Jobs, name: str, replicas: int) -> None:
    launcher = jobs.wait_running(name, timeout=180)
    children = jobs.children(name)
    assert children["pods"] == sorted([*(f"{name}-worker-{i}" for i in range(replicas)), launcher])
    assert children["jobs.batch"] == [f"{name}-launcher"]
    assert jobs.status(name)["restarts"] == 0


def test_a_clean_shutdown_hands_the_lease_over_at_once(
    audited: KubeCluster, ns: str, tmp_path: Path
) -> None:
    leader, standby = _replicas(audited, ns, tmp_path, qps=20)
    try:
        jobs = Jobs(audited, ns, standby)
        jobs.apply(hvjob("calm", replicas=4, worker={"resources": {"limits": {"cpu": "100m"}}}))
        leader.wait(lambda: jobs.status("calm").get("phase"), 30, "the leader acted")
        stopped = time.monotonic()
        leader.stop()  # SIGTERM: kopf's cleanup cancels the elector, which releases
        standby.wait(
            lambda: f"-{standby.pid}-" in _holder(audited, ns), LEASE_DURATION, "the standby leads"
        )
        handover = time.monotonic() - stopped
        led_at = datetime.now(UTC)  # the audit log's clock: this machine's
        # About 3 s (the old process's exit, then one retry period of 2 s). The release is
        # checked in the leader's log below; the bound here is the lease's own duration,
        # not a guess at how fast a loaded 2-core machine ends a process (the old 6 s).
        print(f"hand-over after SIGTERM of the leader: {handover:.1f}s")
        assert handover < LEASE_DURATION
        assert "released the lease" in leader.log_tail(200)
        _finishes_with_one_of_each(jobs, "calm", 4)
        # The old leader may have brought the job to Running before it stopped; then the
        # new one has nothing to write (a CI run of 2026-12-06), and what is left to check
        # is that the old one wrote nothing once the new one led.
        writes = _settled_writes(audited, ns)
        if any(pid == str(standby.pid) for _, pid, _ in writes):
            _one_writer_at_a_time(writes, leader.pid, standby.pid)
        else:
            assert {pid for _, pid, _ in writes} == {str(leader.pid)}, writes
            assert max(at for at, _, _ in writes) < led_at, (writes, led_at)
    finally:
        for op in (leader, standby):
            op.stop()
            print(f"--- {op.log_path.name} ---\n{op.log_tail(40)}")


def test_a_frozen_leader_writes_nothing_when_it_thaws(
    audited: KubeCluster, ns: str, tmp_path: Path
) -> None:
    """SIGSTOP past the lease, the standby takes over and creates the rest, SIGCONT:
    the old leader's writes that were under way are refused by the fence, and it
    sends nothing until it holds the Lease again (it does not: the other renews)."""
    leader, standby = _replicas(audited, ns, tmp_path, qps=5)  # slow: creates under way
    try:
        jobs = Jobs(audited, ns, standby)
        jobs.apply(hvjob("frozen", replicas=40, worker={"resources": {"limits": {"cpu": "10m"}}}))
        standby.wait(lambda: len(jobs.pods("frozen")) >= 5, 60, "creation under way")
        os.kill(leader.pid, signal.SIGSTOP)
        try:
            standby.wait(
                lambda: f"-{standby.pid}-" in _holder(audited, ns), 40, "the standby leads"
            )
            standby.wait(
                lambda: standby.requests("POST", "Pod") > 0, 30, "the new leader creates pods"
            )
        finally:
            os.kill(leader.pid, signal.SIGCONT)
        _finishes_with_one_of_each(jobs, "frozen", 40)
        # The thawed replica had writes in flight; it sent none of them.
        leader.wait(
            lambda: (
                "does not hold the leader Lease" in leader.log_tail(400)
                or "lost the lease" in leader.log_tail(400)
            ),
            20,
            "the thawed replica stood down",
        )
        _one_writer_at_a_time(_writes_once_seen(audited, ns, standby.pid), leader.pid, standby.pid)
    finally:
        for op in (leader, standby):
            with_signal = op.proc is not None and op.proc.poll() is None
            if with_signal:
                os.kill(op.pid, signal.SIGCONT)
            op.stop()
            print(f"--- {op.log_path.name} ---\n{op.log_tail(60)}")


def test_a_throttled_leader_keeps_its_lease_and_acts_alone(
    audited: KubeCluster, ns: str, tmp_path: Path
) -> None:
    """--qps 5 and 150 workers: 30 s and more of creates queued on the reconciler's
    token bucket. The elector's own client renews past them, so the Lease never
    moves and the standby never acts (both did, before it had a client of its own)."""
    leader, standby = _replicas(audited, ns, tmp_path, qps=5)
    try:
        holder = _holder(audited, ns)
        jobs = Jobs(audited, ns, leader)
        jobs.apply(hvjob("busy", replicas=150, worker={"resources": {"limits": {"cpu": "1m"}}}))

        def created_all() -> bool:
            assert _holder(audited, ns) == holder, "the Lease moved while the leader worked"
            return len(jobs.pods("busy")) >= 150

        leader.wait(created_all, 120, "150 workers created by the throttled leader")
        _finishes_with_one_of_each(jobs, "busy", 150)
        assert _holder(audited, ns) == holder
        assert standby.requests("POST", "Pod") == 0
        time.sleep(1.5)  # the audit log's batch
        assert {pid for _, pid, _ in _writes(audited, ns)} == {str(leader.pid)}
    finally:
        for op in (leader, standby):
            op.stop()
            print(f"--- {op.log_path.name} ---\n{op.log_tail(40)}")


def test_an_older_crd_is_named_at_start_with_the_fix(
    audited: KubeCluster, ns: str, tmp_path: Path
) -> None:
    """helm upgrade without the new CRD: the operator says so in its log, a metric and
    a Warning Event, with the command that fixes it. (Here, in a control plane of its
    own, because the CRD is replaced for the test.)"""
    import copy

    import yaml

    from horovod_operator import crd

    current = crd.crd()
    old = copy.deepcopy(current)
    status = old["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    del status["properties"]["uncountedRestarts"]
    apply = ("apply", "--server-side", "--force-conflicts", "-f", "-")
    audited.kubectl(*apply, input=yaml.safe_dump(old))
    op = Operator(audited, ns, tmp_path / "op.log")
    try:
        op.start()
        op.wait(lambda: "older than this operator" in op.log_tail(100), 30, "the log says so")
        assert "status.uncountedRestarts" in op.log_tail(100)
        assert "kubectl apply --server-side" in op.log_tail(100)
        metric = op.wait(
            lambda: next(
                (
                    line
                    for line in op.metrics().splitlines()
                    if line.startswith("horovod_operator_crd_outdated_fields ")
                ),
                None,
            ),
            10,
            "the metric",
        )
        assert float(metric.split()[1]) == 1.0
        events = audited.kubectl(
            "get", "events", "-n", "default", "--field-selector", "reason=CRDOutdated", "-o", "json"
        )
        assert any(
            "status.uncountedRestarts" in e["message"] for e in json.loads(events.stdout)["items"]
        )
    finally:
        op.stop()
        audited.kubectl(*apply, input=yaml.safe_dump(current))
