"""Elastic jobs without a cluster: the API's refusals, the objects, and decide()'s table.

An elastic job keeps maxReplicas worker pods, starts its launcher once
worker.replicas are Ready, goes on (no restart) when a worker is lost, replaces
that worker, counts a failure once against backoffLimit and not a deletion, and
ends with the launcher's result.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

import horovod_contract as contract
from horovod_operator import builders
from horovod_operator.api import format_validation_error, parse_job
from horovod_operator.decide import decide
from horovod_operator.plan import Delete
from tests.operator.test_decide import (
    A100,
    ADMITTED_WL,
    QUEUE,
    RUNNING,
    SUSPENDED,
    T0,
    body,
    created,
    kueue,
    launcher_job,
    launcher_pod,
    observe,
    stored,
    worker,
    workload,
)

ELASTIC = {"minReplicas": 1, "maxReplicas": 3}


def elastic_body(status: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    spec.setdefault("launchMode", "gloo")
    spec.setdefault("elastic", ELASTIC)
    return body(status, **spec)


def refusal(**spec: Any) -> str:
    with pytest.raises(ValidationError) as caught:
        parse_job(elastic_body(**spec))
    return format_validation_error(caught.value)


# --- the API ------------------------------------------------------------------------------


def test_elastic_needs_gloo_and_a_start_count_within_its_bounds() -> None:
    assert "elastic: needs launchMode gloo" in refusal(launchMode="mpi")
    message = refusal(worker={"replicas": 4})
    assert "worker.replicas: 4 is outside elastic.minReplicas..elastic.maxReplicas" in message
    assert "worker.replicas: 2 is outside" in refusal(elastic={"minReplicas": 3, "maxReplicas": 4})


def test_a_volcano_gang_takes_an_elastic_jobs_minimum() -> None:
    job = parse_job(
        elastic_body(scheduling={"queue": "q", "gang": {"policy": "Volcano"}}),
        default_image="img",
    )
    assert job.spec.gang_size() == 1
    assert job.spec.worker_count() == 3
    message = refusal(scheduling={"gang": {"minAvailable": 4}})
    assert "minAvailable: 4 is more than elastic.maxReplicas (3)" in message


def test_an_elastic_job_in_kueue_asks_for_its_maximum_and_runs_with_what_it_got() -> None:
    """Kueue's partial admission: the worker pod set counts maxReplicas with minCount
    minReplicas; admitted with fewer, the job creates only those and starts its
    launcher once they are Ready (it would wait forever for worker.replicas)."""
    queued = kueue(elastic_body(scheduling=QUEUE), with_infra=False)
    workers = queued.creates[0]["spec"]["podSets"][0]
    assert (workers["count"], workers["minCount"]) == (3, 1)
    admitted = workload(*ADMITTED_WL, admitted_to="a100")
    admitted["status"]["admission"]["podSetAssignments"][0]["count"] = 1
    suspended = {**SUSPENDED, "workers": {"replicas": 3}}
    plan = kueue(elastic_body(suspended, scheduling=QUEUE), [], wl=admitted, flavors={"a100": A100})
    assert created(plan) == ["Pod/j-worker-0"]
    pending = {**RUNNING, "phase": "Pending", "launcher": None, "workers": {"replicas": 1}}
    ready = kueue(
        elastic_body(pending, scheduling=QUEUE), [worker(0)], wl=admitted, flavors={"a100": A100}
    )
    assert created(ready) == ["Job/j-launcher"]
    assert stored(ready)["workers"]["replicas"] == 1


def test_the_job_name_must_leave_room_for_the_last_possible_worker() -> None:
    # 54 characters: <name>-worker-9 fits a DNS label (63), <name>-worker-10 does not.
    job = elastic_body(elastic={"minReplicas": 1, "maxReplicas": 11})
    job["metadata"]["name"] = "j" * 54
    with pytest.raises(ValidationError, match="worker-10"):
        parse_job(job)
    job["spec"]["elastic"]["maxReplicas"] = 10
    assert parse_job(job).spec.worker_count() == 10


# --- the objects --------------------------------------------------------------------------


def test_workers_run_the_agent_behind_a_readiness_probe_the_launcher_the_driver() -> None:
    job = parse_job(elastic_body(slotsPerWorker=2, worker={"replicas": 2}))
    pod = builders.new_worker_pod(job, 2, 0)
    container = pod["spec"]["containers"][0]
    assert container["command"] == [*contract.ELASTIC_AGENT_COMMAND, "python", "train.py"]
    probe = container["readinessProbe"]["httpGet"]
    assert probe == {"path": contract.ELASTIC_READY_PATH, "port": contract.ELASTIC_AGENT_PORT}
    assert {"name": "agent", "containerPort": contract.ELASTIC_AGENT_PORT, "protocol": "TCP"} in (
        container["ports"]
    )
    env = {e["name"]: e.get("value") for e in container["env"]}
    # The size changes: no rank may insist on one.
    assert contract.ENV_EXPECTED_SIZE not in env
    assert env[contract.ENV_WORKER_INDEX] == "2"
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True

    launcher = builders.new_launcher_job(job, 0)["spec"]["template"]["spec"]["containers"][0]
    assert launcher["command"] == [
        *contract.ELASTIC_LAUNCHER_COMMAND,
        "--agents", "/etc/horovod/config/agents",
        "--np", "4", "--min-np", "2", "--max-np", "6",
        "--timeout", "600", "--port", str(contract.GLOO_RENDEZVOUS_PORT),
    ]  # fmt: skip
    data = builders.new_config_map(job)["data"]
    assert data == {
        "agents": "".join(
            f"j-worker-{i}.j-worker.ns.svc:{contract.ELASTIC_AGENT_PORT}\n" for i in range(3)
        )
    }
    ports = builders.new_worker_service(job)["spec"]["ports"]
    assert [p["port"] for p in ports] == [
        contract.GLOO_RENDEZVOUS_PORT,
        contract.ELASTIC_AGENT_PORT,
    ]


# --- decide -------------------------------------------------------------------------------


def test_it_creates_max_workers_and_the_launcher_once_the_start_count_is_ready() -> None:
    first = decide(observe(elastic_body(), with_infra=False))
    assert created(first) == [
        "ConfigMap/j-config",
        "Service/j-worker",
        "Pod/j-worker-0",
        "Pod/j-worker-1",
        "Pod/j-worker-2",
    ]
    pending = {"phase": "Pending", "startTime": T0, "attemptStartTime": T0}
    # Two of three Ready (worker.replicas is 2), the third unschedulable: start.
    waiting = worker(2, phase="Pending", ready=False)
    plan = decide(observe(elastic_body(pending), [worker(0), worker(1), waiting]))
    assert created(plan) == ["Job/j-launcher"]
    one_ready = [worker(0), worker(1, ready=False), waiting]
    assert created(decide(observe(elastic_body(pending), one_ready))) == []


def running(**elastic: Any) -> dict[str, Any]:
    status: dict[str, Any] = {**RUNNING, "workers": {"replicas": 3}}
    status["elastic"] = {"workers": 3, **elastic}
    return status


def failed_worker(i: int, code: int = 1, **status: Any) -> dict[str, Any]:
    terminated = {"exitCode": code, "reason": "Error", "message": "Traceback ...\nboom"}
    pod = worker(i, phase="Failed", ready=False, **status)
    pod["metadata"]["uid"] = f"w{i}-uid"
    pod["status"]["containerStatuses"] = [{"name": "worker", "state": {"terminated": terminated}}]
    return pod


def test_a_failed_worker_is_replaced_and_counted_once_without_a_restart() -> None:
    pods = [worker(0), worker(1), failed_worker(2), launcher_pod()]
    plan = decide(observe(elastic_body(running()), pods, launcher_job()))
    status = stored(plan)
    assert status["phase"] == "Running" and status["restarts"] == 0
    assert plan.deletes == [Delete("Pod", "j-worker-2", uid="w2-uid")]
    assert status["elastic"]["workerFailures"] == 1
    lost = status["elastic"]["lostWorkers"]
    assert [(w["pod"], w["uid"], w["exitCode"], w["counted"]) for w in lost] == [
        ("j-worker-2", "w2-uid", 1, True)
    ]
    assert any(e.reason == "WorkerLost" and "j-worker-2" in e.message for e in plan.events)
    # Two of three Ready now: a resize, and the message says so.
    assert status["elastic"]["workers"] == 2 and status["elastic"]["resizes"] == 1
    assert any(
        e.reason == "Resized" and "2 worker(s) ready, was 3" in e.message for e in plan.events
    )
    assert "training with 2 of 3 worker(s) ready" in status["message"]

    # The next sync sees the same pod (its deletion not done yet): not counted again.
    again = decide(observe(elastic_body(status), pods, launcher_job()))
    assert stored(again)["elastic"]["workerFailures"] == 1
    assert not any(e.reason == "WorkerLost" for e in again.events)
    # Once it is gone, its replacement is created under the same name.
    gone = [worker(0), worker(1), launcher_pod()]
    assert created(decide(observe(elastic_body(status), gone, launcher_job()))) == [
        "Pod/j-worker-2"
    ]


def test_a_deleted_worker_is_replaced_but_not_counted() -> None:
    deleted = worker(1, terminating=True)
    deleted["metadata"]["uid"] = "w1-uid"
    pods = [worker(0), deleted, worker(2), launcher_pod()]
    plan = decide(observe(elastic_body(running()), pods, launcher_job()))
    status = stored(plan)
    assert status["phase"] == "Running"
    lost = status["elastic"]["lostWorkers"]
    assert [(w["pod"], w["reason"], w["counted"]) for w in lost] == [
        ("j-worker-1", "PodDeleted", False)
    ]
    assert status["elastic"]["workerFailures"] == 0


def test_more_counted_failures_than_backoff_limit_fail_the_job() -> None:
    # backoffLimit is 1 in these tests: a second counted failure ends the job.
    earlier = {
        "pod": "j-worker-0", "uid": "old", "time": T0, "counted": True, "reason": "Error",
    }  # fmt: skip
    status = running(workerFailures=1, lostWorkers=[earlier])
    pods = [worker(0), worker(1), failed_worker(2, code=3), launcher_pod()]
    plan = decide(observe(elastic_body(status), pods, launcher_job()))
    result = stored(plan)
    assert result["phase"] == "Failed" and result["reason"] == "WorkerLost"
    assert "2 worker pods failed, more than backoffLimit (1)" in result["message"]


def test_a_pod_failure_policy_rule_decides_for_a_lost_worker_too() -> None:
    rules = {"podFailurePolicy": {"rules": [{"action": "FailJob", "onExitCodes": {
        "operator": "In", "values": [42]}}]}}  # fmt: skip
    pods = [worker(0), worker(1), failed_worker(2, code=42), launcher_pod()]
    plan = decide(observe(elastic_body(running(), runPolicy=rules), pods, launcher_job()))
    result = stored(plan)
    assert result["phase"] == "Failed"
    assert "worker pod j-worker-2 failed (Error, exit code 42)" in result["message"]


def test_the_launcher_decides_how_it_ends() -> None:
    done = decide(
        observe(
            elastic_body(running()),
            [worker(0), worker(1), worker(2), launcher_pod("Succeeded")],
            launcher_job("Complete"),
        )
    )
    assert stored(done)["phase"] == "Succeeded"
    failed = decide(
        observe(
            elastic_body(running()),
            [worker(0), worker(1), launcher_pod("Failed")],
            launcher_job("Failed"),
        )
    )
    status = stored(failed)
    assert status["phase"] == "Restarting" and status["reason"] == "LauncherFailed"


def test_waiting_workers_of_a_running_elastic_job_are_in_its_message_not_a_stall() -> None:
    unschedulable = worker(2, phase="Pending", ready=False)
    unschedulable["status"]["conditions"] = [
        {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": "0/2 nodes are available: 2 Insufficient nvidia.com/gpu.",
        }
    ]
    status = running()
    status["elastic"]["workers"] = 2
    pods = [worker(0), worker(1), unschedulable, launcher_pod()]
    result = stored(decide(observe(elastic_body(status), pods, launcher_job())))
    assert result["phase"] == "Running"
    assert not any(c["type"] == "Stalled" and c["status"] == "True" for c in result["conditions"])
    assert "pod j-worker-2: 0/2 nodes are available" in result["message"]


def with_uid(pod: dict[str, Any], uid: str) -> dict[str, Any]:
    pod["metadata"]["uid"] = uid
    return pod


def test_a_worker_gone_between_two_looks_is_named_from_the_pods_last_seen() -> None:
    pods = [with_uid(worker(i), f"uid-{i}-abcdef") for i in range(3)]
    first = stored(
        decide(observe(elastic_body(running()), [*pods, launcher_pod()], launcher_job()))
    )
    assert first["elastic"]["workerUids"] == {f"j-worker-{i}": f"uid-{i}-ab" for i in range(3)}
    # worker-1 vanished (a forced deletion; the watch never showed it terminating).
    plan = decide(observe(elastic_body(first), [pods[0], pods[2], launcher_pod()], launcher_job()))
    status = stored(plan)
    lost = status["elastic"]["lostWorkers"]
    assert [(w["pod"], w["uid"], w["reason"]) for w in lost] == [
        ("j-worker-1", "uid-1-ab", "PodDeleted")
    ]
    assert created(plan) == ["Pod/j-worker-1"]
    # Its replacement appears: nothing more is lost.
    back = [pods[0], with_uid(worker(1), "uid-9-zzzzzz"), pods[2], launcher_pod()]
    again = stored(decide(observe(elastic_body(status), back, launcher_job())))
    assert len(again["elastic"]["lostWorkers"]) == 1


def test_a_worker_never_created_is_not_lost() -> None:
    # A pod quota refused worker-2 from the start: missing, but never seen.
    pods = [with_uid(worker(0), "uid-0-abcdef"), with_uid(worker(1), "uid-1-abcdef")]
    status = running()
    status["elastic"]["workers"] = 2
    for _ in range(2):
        status = stored(
            decide(observe(elastic_body(status), [*pods, launcher_pod()], launcher_job()))
        )
    assert status["elastic"]["lostWorkers"] == [] and status["phase"] == "Running"


def test_a_worker_that_cannot_be_placed_is_no_stall_when_the_start_count_runs() -> None:
    unschedulable = worker(2, phase="Pending", ready=False)
    unschedulable["status"]["conditions"] = [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "no GPU"}
    ]
    pending = {"phase": "Pending", "startTime": T0, "attemptStartTime": T0}
    started = stored(decide(observe(elastic_body(pending), [worker(0), worker(1), unschedulable])))
    assert not any(c["type"] == "Stalled" and c["status"] == "True" for c in started["conditions"])
    # With only one of the two it starts with running, the start is blocked: a stall.
    blocked = [worker(0), worker(1, phase="Pending", ready=False), unschedulable]
    waiting = stored(decide(observe(elastic_body(pending), blocked)))
    stalled = [c for c in waiting["conditions"] if c["type"] == "Stalled"]
    assert stalled and stalled[0]["status"] == "True" and "no GPU" in stalled[0]["message"]


def test_a_suspension_loses_no_worker_and_the_resumed_pods_are_new() -> None:
    pods = [with_uid(worker(i), f"uid-{i}-abcdef") for i in range(3)]
    status = stored(
        decide(observe(elastic_body(running()), [*pods, launcher_pod()], launcher_job()))
    )
    assert len(status["elastic"]["workerUids"]) == 3
    suspended = stored(
        decide(
            observe(
                elastic_body(status, runPolicy={"suspend": True}),
                [*pods, launcher_pod()],
                launcher_job(),
            )
        )
    )
    assert suspended["phase"] == "Suspended" and suspended["elastic"]["workerUids"] == {}
    # Resumed (the same attempt number): other pods, none of them a loss.
    again = [with_uid(worker(i), f"new-{i}-abcdef") for i in range(3)]
    resumed = stored(decide(observe(elastic_body(suspended), again)))
    assert resumed["elastic"]["lostWorkers"] == [], resumed["elastic"]
