"""decide(): every phase transition and every row of the edit table, without a cluster."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from horovod_operator import queueing
from horovod_operator.api import MAX_SECONDS, HorovodJobStatus, parse_job, parse_status
from horovod_operator.builders import new_config_map
from horovod_operator.children import sort_children
from horovod_operator.decide import decide
from horovod_operator.plan import (
    Delete,
    Event,
    Observation,
    Plan,
    PodSweep,
    Priority,
    Refusal,
)
from horovod_operator.sshkeys import KeyPair
from horovod_operator.status_writing import status_body

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
NOW_S = "2026-01-01T12:00:00Z"
T0 = "2026-01-01T11:59:00Z"
KEYS = KeyPair(private_openssh="PRIVATE", public_openssh="PUBLIC")
UID = "u-1"
# A job that wants no gang (most tests here run with Observation's gang_api False).
NO_GANG: dict[str, Any] = {"scheduling": {"gang": {"policy": "None"}}}


def body(status: dict[str, Any] | None = None, generation: int = 1, **spec: Any) -> dict[str, Any]:
    run_policy = spec.pop("runPolicy", {})
    worker = spec.pop("worker", {})
    result: dict[str, Any] = {
        "apiVersion": "horovod.ai/v1alpha1",
        "kind": "HorovodJob",
        "metadata": {"name": "j", "namespace": "ns", "uid": UID, "generation": generation},
        "spec": {
            "image": "img",
            "command": ["python", "train.py"],
            "worker": {"replicas": 2, **worker},
            "runPolicy": {"backoffLimit": 1, **run_policy},
            **spec,
        },
    }
    if status is not None:
        result["status"] = status
    return result


def owned(uid: str = UID, kind: str = "HorovodJob", name: str = "j") -> list[dict[str, Any]]:
    return [{"kind": kind, "name": name, "uid": uid, "controller": True}]


def worker(
    i: int,
    phase: str = "Running",
    ready: bool = True,
    attempt: int = 0,
    uid: str = UID,
    terminating: bool = False,
    uid_label: str | None = None,
    **status: Any,
) -> dict[str, Any]:
    """A worker pod; `uid_label`: its job-uid label, which pods made before the
    operator labelled workers with it lack."""
    labels = {"horovod.ai/role": "worker", "horovod.ai/attempt": str(attempt)}
    if uid_label is not None:
        labels["horovod.ai/job-uid"] = uid_label
    meta: dict[str, Any] = {
        "name": f"j-worker-{i}",
        "uid": f"pod-{i}",
        "labels": labels,
        "ownerReferences": owned(uid),
    }
    if terminating:
        meta["deletionTimestamp"] = NOW_S
    conditions = [{"type": "Ready", "status": "True" if ready else "False"}]
    return {
        "kind": "Pod",
        "metadata": meta,
        "spec": {"containers": [{"name": "worker"}]},
        "status": {"phase": phase, "conditions": conditions, **status},
    }


def launcher_job(condition: str | None = None, attempt: int = 0, uid: str = UID) -> dict[str, Any]:
    return {
        "kind": "Job",
        "metadata": {
            "name": "j-launcher",
            "uid": "lj",
            "labels": {"horovod.ai/role": "launcher", "horovod.ai/attempt": str(attempt)},
            "ownerReferences": owned(uid),
        },
        "status": {"conditions": [{"type": condition, "status": "True"}] if condition else []},
    }


def launcher_pod(phase: str = "Running", owner: str | None = "lj", **status: Any) -> dict[str, Any]:
    return {
        "kind": "Pod",
        "metadata": {
            "name": "j-launcher-x",
            "labels": {
                "horovod.ai/role": "launcher",
                "horovod.ai/attempt": "0",
                "horovod.ai/job-uid": UID,
            },
            "ownerReferences": owned(owner, "Job", "j-launcher") if owner else [],
            "creationTimestamp": T0,
        },
        "spec": {"containers": [{"name": "launcher"}]},
        "status": {"phase": phase, **status},
    }


def infra(uid: str = UID, terminating: bool = False) -> dict[str, list[dict[str, Any]]]:
    """The Secret, ConfigMap and Service, as the slim indexes keep them."""
    result = {}
    for kind, name in (("Secret", "j-ssh"), ("ConfigMap", "j-config"), ("Service", "j-worker")):
        meta: dict[str, Any] = {"name": name, "ownerReferences": owned(uid)}
        if terminating:
            meta["deletionTimestamp"] = NOW_S
        obj: dict[str, Any] = {"kind": kind, "metadata": meta}
        if kind == "ConfigMap":
            job = parse_job(body())
            obj["data"] = new_config_map(job)["data"]
        result[kind] = [obj]
    return result


def observe(
    job: dict[str, Any],
    pods: list[dict[str, Any]] | None = None,
    ljob: dict[str, Any] | None = None,
    with_infra: bool = True,
    now: datetime = NOW,
    **extra: Any,
) -> Observation:
    parts = infra() if with_infra else {}
    parts.update(extra.pop("objects", {}))
    children = sort_children(UID, {"Pod": pods or [], "Job": [ljob] if ljob else [], **parts})
    return Observation(
        body=job,
        children=children,
        now=now,
        keys=None if children.secret is not None else KEYS,
        host_key=None if children.secret is not None else KEYS,
        **extra,
    )


def created(plan: Plan) -> list[str]:
    return [f"{o['kind']}/{o['metadata']['name']}" for o in plan.creates]


def cond(plan: Plan, type_: str) -> tuple[str, str, str]:
    assert plan.status is not None
    found = next(c for c in plan.status.conditions if c.type == type_)
    return found.status, found.reason, found.message


def stored(plan: Plan) -> dict[str, Any]:
    assert plan.status is not None
    return status_body(plan.status)


RUNNING = {
    "phase": "Running",
    "startTime": T0,
    "attemptStartTime": T0,
    "workers": {"replicas": 2},
    "launcher": {"phase": "Running", "podName": "j-launcher-x"},
    "observedGeneration": 1,
}
ALL_UP = [worker(0), worker(1), launcher_pod()]


# --- a new job ----------------------------------------------------------------------------


def test_first_plan_writes_the_status_then_creates_everything_but_the_launcher() -> None:
    plan = decide(observe(body(**NO_GANG), with_infra=False))
    status = stored(plan)
    assert status["phase"] == "Pending"
    assert (status["startTime"], status["attemptStartTime"]) == (NOW_S, NOW_S)
    assert status["observedGeneration"] == 1
    assert status["reason"] == "WaitingForWorkers"
    assert created(plan) == [
        "Secret/j-ssh",
        "ConfigMap/j-config",
        "Service/j-worker",
        "Pod/j-worker-0",
        "Pod/j-worker-1",
    ]
    assert plan.events == [] and plan.deletes == []
    # The startup timeout (20 minutes by default) is the next timer.
    assert plan.requeue_after == pytest.approx(1200.5)


def test_a_progress_deadline_on_an_operator_that_reads_no_logs_is_named_once() -> None:
    job = body(runPolicy={"progressDeadlineSeconds": 600}, **NO_GANG)
    plan = decide(observe(job, with_infra=False, reads_logs=False))
    assert [(e.type, e.reason) for e in plan.events] == [("Warning", "ProgressNotRead")]
    assert "--no-first-step-metric" in plan.events[0].message
    # Once: the next pass has a status.
    again = body(stored(plan), runPolicy={"progressDeadlineSeconds": 600}, **NO_GANG)
    later = decide(observe(again, with_infra=False, reads_logs=False))
    assert not [e for e in later.events if e.reason == "ProgressNotRead"]
    # An operator that reads logs says nothing.
    assert decide(observe(job, with_infra=False)).events == []


def test_auto_gang_on_a_cluster_without_one_says_so_once() -> None:
    plan = decide(observe(body(), with_infra=False, gang_api=False))
    assert [(e.type, e.reason) for e in plan.events] == [("Warning", "NoGangScheduler")]
    assert "placed one by one" in plan.events[0].message
    assert cond(plan, "GangScheduled")[:2] == ("False", "NoGangScheduler")
    assert "Pod/j-worker-0" in created(plan)  # the job goes on without one
    later = decide(observe(body(stored(plan)), with_infra=False, gang_api=False))
    assert later.events == []
    assert cond(later, "GangScheduled")[:2] == ("False", "NoGangScheduler")
    # Said for Auto only, and only where a gang is known not to be served.
    for quiet in (
        observe(body(**NO_GANG), with_infra=False),
        observe(body(), with_infra=False, gang_api=True),
        observe(body(worker={"replicas": 1}), with_infra=False),
    ):
        assert not [e for e in decide(quiet).events if e.reason == "NoGangScheduler"]


def test_a_gloo_job_has_no_ssh_secret_even_when_keys_are_at_hand() -> None:
    plan = decide(observe(body(launchMode="gloo"), with_infra=False))
    assert created(plan) == [
        "ConfigMap/j-config",
        "Service/j-worker",
        "Pod/j-worker-0",
        "Pod/j-worker-1",
    ]


def test_a_gloo_job_succeeds_when_every_worker_pod_has() -> None:
    done = [worker(0, "Succeeded"), worker(1, "Succeeded"), launcher_pod()]
    plan = decide(observe(body(RUNNING, launchMode="gloo"), done, launcher_job()))
    assert stored(plan)["phase"] == "Succeeded"
    # cleanPodPolicy Running: a launcher still waiting for a lost report goes.
    assert Delete("Job", "j-launcher", "Foreground", uid="lj") in plan.deletes


def test_the_launcher_waits_for_every_worker_ready_then_is_created() -> None:
    pending = {**RUNNING, "phase": "Pending", "launcher": None}
    half = decide(observe(body(pending), [worker(0), worker(1, ready=False)]))
    assert created(half) == []
    full = decide(observe(body(pending), [worker(0), worker(1)]))
    assert created(full) == ["Job/j-launcher"]
    assert stored(full)["phase"] == "Starting"
    at_startup = body(pending, runPolicy={"launcherCreationPolicy": "AtStartup"})
    both_pending = [worker(0, "Pending"), worker(1, "Pending")]
    assert created(decide(observe(at_startup, both_pending))) == ["Job/j-launcher"]


# --- phase transitions --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("case", "status", "pods", "ljob", "phase", "events", "deletes"),
    [
        (
            "launcher running",
            {**RUNNING, "phase": "Starting", "launcher": None},
            ALL_UP,
            launcher_job(),
            "Running",
            [("Normal", "LauncherRunning")],
            [],
        ),
        (
            "launcher succeeded, cleanPodPolicy Running",
            RUNNING,
            [worker(0), worker(1), launcher_pod("Succeeded")],
            launcher_job("Complete"),
            "Succeeded",
            [("Normal", "LauncherSucceeded")],
            [Delete("Pod", "j-worker-0", uid="pod-0"), Delete("Pod", "j-worker-1", uid="pod-1")],
        ),
        (
            "worker failed, restart",
            RUNNING,
            [worker(0), worker(1, "Failed", reason="OOMKilled"), launcher_pod()],
            launcher_job(),
            "Restarting",
            [("Warning", "WorkerFailed")],
            [
                Delete("Pod", "j-worker-0", uid="pod-0"),
                Delete("Pod", "j-worker-1", uid="pod-1"),
                Delete("Job", "j-launcher", "Foreground", uid="lj"),
            ],
        ),
        (
            "worker failed, backoff spent",
            {**RUNNING, "restarts": 1},
            [worker(0, attempt=1), worker(1, "Failed", attempt=1)],
            None,
            "Failed",
            [("Warning", "WorkerFailed")],
            [Delete("Pod", "j-worker-0", uid="pod-0")],
        ),
        (
            "restarting waits for the old attempt",
            {**RUNNING, "phase": "Restarting", "restarts": 1, "launcher": None},
            [worker(0, terminating=True)],
            None,
            "Restarting",
            [],
            [],
        ),
        (
            "deadline from the stored startTime",
            RUNNING,
            ALL_UP,
            launcher_job(),
            "Failed",
            [("Warning", "DeadlineExceeded")],
            [
                Delete("Pod", "j-worker-0", uid="pod-0"),
                Delete("Pod", "j-worker-1", uid="pod-1"),
                Delete("Job", "j-launcher", "Foreground", uid="lj"),
            ],
        ),
    ],
)
def test_transitions(
    case: str,
    status: dict[str, Any],
    pods: list[dict[str, Any]],
    ljob: dict[str, Any] | None,
    phase: str,
    events: list[tuple[str, str]],
    deletes: list[Delete],
) -> None:
    policy = {"activeDeadlineSeconds": 60} if case.startswith("deadline") else {}
    plan = decide(observe(body(status, runPolicy=policy), pods, ljob))
    assert stored(plan)["phase"] == phase, case
    assert [(e.type, e.reason) for e in plan.events] == events, case
    assert plan.deletes == deletes, case


# --- deleting workers in one request ------------------------------------------------------

SWEEP_LABELS = "app.kubernetes.io/managed-by=horovod-operator,horovod.ai/role=worker"


def test_cleanup_sweeps_the_unfinished_workers_by_label_in_one_request() -> None:
    pods = [
        worker(0, uid_label=UID),
        worker(1, "Pending", ready=False, uid_label=UID),
        worker(2, "Succeeded", uid_label=UID),  # kept: cleanPodPolicy Running
        launcher_pod("Succeeded"),
    ]
    plan = decide(observe(body(RUNNING, worker={"replicas": 3}), pods, launcher_job("Complete")))
    assert stored(plan)["phase"] == "Succeeded"
    assert plan.deletes == []
    assert plan.sweeps == [
        PodSweep(
            f"{SWEEP_LABELS},horovod.ai/job-uid={UID}",
            "status.phase!=Succeeded,status.phase!=Failed",
            ("j-worker-0", "j-worker-1"),
            ("pod-0", "pod-1"),
        )
    ]


def test_an_elastic_job_keeps_its_workers_a_moment_for_the_first_step_look() -> None:
    # Rank 0's start line is in a worker's own log: the progress watcher's last look
    # reads it before cleanPodPolicy deletes that worker (the kind rung missed it).
    elastic: dict[str, Any] = {
        "launchMode": "gloo",
        "elastic": {"minReplicas": 1, "maxReplicas": 2},
    }
    pods = [worker(0, uid_label=UID), worker(1, uid_label=UID)]
    ended = (NOW - timedelta(seconds=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
    done = {**RUNNING, "phase": "Succeeded", "completionTime": ended}
    waiting = decide(observe(body(done, **elastic), pods, launcher_job("Complete")))
    assert waiting.sweeps == [] and waiting.deletes == []
    assert waiting.requeue_after == pytest.approx(8.0)
    # Once the first step is in the status, or the look had its time, they go.
    read = decide(
        observe(body({**done, "firstStepTime": ended}, **elastic), pods, launcher_job("Complete"))
    )
    late = decide(
        observe(body({**done, "completionTime": T0}, **elastic), pods, launcher_job("Complete"))
    )
    for plan in (read, late):
        assert [sweep.names for sweep in plan.sweeps] == [("j-worker-0", "j-worker-1")]
    # A job that is not elastic has its rank 0's line in the launcher's log, which stays.
    plain = decide(observe(body(done), pods, launcher_job("Complete")))
    assert [sweep.names for sweep in plain.sweeps] == [("j-worker-0", "j-worker-1")]


def test_a_restart_sweeps_every_worker_and_deletes_the_launcher() -> None:
    pods = [worker(0, uid_label=UID), worker(1, "Failed", uid_label=UID), launcher_pod()]
    plan = decide(observe(body(RUNNING), pods, launcher_job()))
    assert stored(plan)["phase"] == "Restarting"
    assert plan.sweeps == [
        PodSweep(
            f"{SWEEP_LABELS},horovod.ai/job-uid={UID}",
            "",
            ("j-worker-0", "j-worker-1"),
            ("pod-0", "pod-1"),
        )
    ]
    assert plan.deletes == [Delete("Job", "j-launcher", "Foreground", uid="lj")]


@pytest.mark.parametrize(
    ("case", "pods"),
    [
        ("one worker", [worker(0, uid_label=UID)]),
        # Made before workers carried the label: a selector would miss it.
        ("an unlabelled worker", [worker(0, uid_label=UID), worker(1)]),
        # Someone else's pod with the job's labels: a selector would take it too.
        (
            "a foreign pod with the label",
            [worker(0, uid_label=UID), worker(1, uid_label=UID), worker(2, uid="x", uid_label=UID)],
        ),
    ],
)
def test_workers_a_selector_cannot_pick_exactly_go_one_by_one(
    case: str, pods: list[dict[str, Any]]
) -> None:
    plan = decide(observe(body(RUNNING, runPolicy={"suspend": True}), pods))
    assert stored(plan)["phase"] == "Suspended", case
    assert plan.sweeps == [], case
    owned_workers = [
        p["metadata"]["name"] for p in pods if p["metadata"]["ownerReferences"][0]["uid"] == UID
    ]
    assert [d.name for d in plan.deletes if d.kind == "Pod"] == owned_workers, case


def test_restart_starts_the_next_attempt_once_the_old_one_is_gone() -> None:
    status = {**RUNNING, "phase": "Restarting", "restarts": 1, "launcher": None}
    plan = decide(observe(body(status), []))
    assert stored(plan)["phase"] == "Pending"
    assert stored(plan)["attemptStartTime"] == NOW_S
    assert created(plan) == ["Pod/j-worker-0", "Pod/j-worker-1"]
    assert plan.creates[0]["metadata"]["labels"]["horovod.ai/attempt"] == "1"


def test_suspend_deletes_the_pods_and_resume_recreates_them() -> None:
    plan = decide(observe(body(RUNNING, runPolicy={"suspend": True}), ALL_UP, launcher_job()))
    assert stored(plan)["phase"] == "Suspended"
    assert plan.events == [Event("Normal", "JobSuspended", "the job is suspended")]
    assert len(plan.deletes) == 3
    suspended = stored(plan)
    resumed = decide(observe(body(suspended), [], now=NOW + timedelta(minutes=5)))
    status = stored(resumed)
    assert status["phase"] == "Pending"
    assert status["startTime"] == "2026-01-01T12:05:00Z"  # the deadline clock restarts
    assert resumed.events == [Event("Normal", "JobResumed", "the job is resumed")]
    assert created(resumed) == ["Pod/j-worker-0", "Pod/j-worker-1"]


def test_ttl_deletes_the_job_from_the_stored_completion_time() -> None:
    done = {**RUNNING, "phase": "Succeeded", "completionTime": T0}
    waiting = decide(observe(body(done, runPolicy={"ttlSecondsAfterFinished": 120}), []))
    assert not waiting.delete_job and waiting.requeue_after == pytest.approx(60.5)
    # An operator that was down when the TTL passed acts when it comes back.
    due = decide(observe(body(done, runPolicy={"ttlSecondsAfterFinished": 30}), []))
    assert due.delete_job


def test_the_longest_timers_neither_overflow_nor_sleep_past_an_hour() -> None:
    policy = {"activeDeadlineSeconds": MAX_SECONDS, "startupTimeoutSeconds": MAX_SECONDS}
    plan = decide(observe(body(RUNNING, runPolicy=policy), ALL_UP, launcher_job()))
    assert stored(plan)["phase"] == "Running"
    assert plan.requeue_after == 3600.0
    done = {**RUNNING, "phase": "Failed", "completionTime": T0}
    ttl = decide(observe(body(done, runPolicy={"ttlSecondsAfterFinished": MAX_SECONDS}), []))
    assert ttl.requeue_after == 3600.0 and not ttl.delete_job


def test_a_deleted_job_is_left_to_garbage_collection() -> None:
    job = body(RUNNING)
    job["metadata"]["deletionTimestamp"] = NOW_S
    assert decide(observe(job, ALL_UP, launcher_job())) == Plan()


# --- ownership ----------------------------------------------------------------------------


def test_pods_and_objects_of_another_owner_are_never_counted_or_adopted() -> None:
    strangers = [worker(0, uid="other"), worker(1, uid="other")]
    plan = decide(observe(body(), strangers, with_infra=False))
    status = stored(plan)
    assert status["workers"]["ready"] == 0
    assert created(plan) == ["Secret/j-ssh", "ConfigMap/j-config", "Service/j-worker"]
    assert cond(plan, "Stalled")[:2] == ("True", "WaitingForPreviousJob")
    assert "Pod j-worker-0 of a previous HorovodJob named j (uid other)" in cond(plan, "Stalled")[2]
    assert plan.deletes == []


def test_delete_and_reapply_waits_for_the_old_children_then_runs_from_scratch() -> None:
    old_objects = infra(uid="old", terminating=True)
    old_pods = [worker(0, uid="old", terminating=True), worker(1, uid="old")]
    plan = decide(
        observe(body(), old_pods, launcher_job("Complete", uid="old"), False, objects=old_objects)
    )
    assert stored(plan)["phase"] == "Pending"  # never Succeeded from the old launcher
    assert created(plan) == []
    assert cond(plan, "Stalled")[1] == "WaitingForPreviousJob"
    assert plan.events[0].reason == "WaitingForPreviousJob"
    fresh = decide(observe(body(stored(plan)), [], with_infra=False))
    assert len(created(fresh)) == 5
    assert cond(fresh, "Stalled")[:2] == ("False", "Progressing")


def test_a_foreign_object_with_the_name_of_a_child_is_a_conflict() -> None:
    secret = {"kind": "Secret", "metadata": {"name": "j-ssh", "ownerReferences": []}}
    plan = decide(observe(body(), [], with_infra=False, objects={"Secret": [secret]}))
    assert "Secret/j-ssh" not in created(plan)
    status, reason, message = cond(plan, "Stalled")
    assert (status, reason) == ("True", "ChildConflict")
    assert "Secret j-ssh already exists and is not controlled by this job (no controller)" in (
        message
    )


def test_an_invalid_edit_of_a_finished_job_keeps_what_clean_pod_policy_kept() -> None:
    done = {**RUNNING, "phase": "Succeeded", "completionTime": NOW_S, "launcher": None}
    job = body(done, generation=2, runPolicy={"cleanPodPolicy": "None"})
    job["spec"]["worker"]["replicas"] = -1  # invalid
    plan = decide(observe(job, [worker(0, "Running"), worker(1, "Running")]))
    assert plan.deletes == [] and plan.sweeps == [] and plan.creates == []
    assert stored(plan)["phase"] == "Succeeded"
    status, reason, message = cond(plan, "SpecRejected")
    assert (status, reason) == ("True", "InvalidSpec")
    assert "the edit of generation 2 is ignored" in message


def test_a_vanished_launcher_job_fails_the_attempt_and_its_pod_goes_first() -> None:
    stray = launcher_pod(owner=None)
    plan = decide(observe(body(RUNNING), [worker(0), worker(1), stray]))
    status = stored(plan)
    assert status["phase"] == "Restarting"
    assert status["failures"][0]["reason"] == "LauncherDeleted"
    assert Delete("Pod", "j-launcher-x") in plan.deletes
    # No new launcher while the old pod exists, even with every worker ready.
    pending = {**status, "phase": "Pending", "restarts": 1}
    again = decide(observe(body(pending), [worker(0, attempt=1), worker(1, attempt=1), stray]))
    assert "Job/j-launcher" not in created(again)


# --- refusals and stuck states ------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "said", "expected"),
    [
        (403, "exceeded quota: q, requested: pods=1", "CreateForbidden"),
        (429, "Too many requests, please try again later.", "CreateThrottled"),
        (500, 'failed calling webhook "deny.example.com": connection refused', "CreateFailed"),
        (503, "the server is currently unable to handle the request", "CreateFailed"),
    ],
)
def test_a_refused_create_becomes_stalled_with_the_servers_message_and_a_warning(
    code: int, said: str, expected: str
) -> None:
    refusal = Refusal("Pod", "j-worker-1", code, said, 1, "worker")
    # No gang wanted: the statement that none applies is another test's.
    plan = decide(observe(body(**NO_GANG), [worker(0)], refusals=[refusal]))
    status, reason, message = cond(plan, "Stalled")
    assert (status, reason) == ("True", expected)
    assert "Pod j-worker-1" in message and said in message
    assert stored(plan)["reason"] == expected
    assert plan.events == [Event("Warning", expected, message)]
    # The same problem again posts no second Event.
    again = decide(observe(body(stored(plan), **NO_GANG), [worker(0)], refusals=[refusal]))
    assert again.events == []
    # A restarted operator has no refusal in memory until it tries again: the refused
    # pod still missing, the condition stands as it was (no flip, no second Event).
    restarted = decide(observe(body(stored(again), **NO_GANG), [worker(0)]))
    assert restarted.events == [] and "Pod/j-worker-1" in created(restarted)
    assert cond(restarted, "Stalled") == cond(plan, "Stalled")
    stalled_since = next(c for c in stored(plan)["conditions"] if c["type"] == "Stalled")
    kept = next(c for c in stored(restarted)["conditions"] if c["type"] == "Stalled")
    assert kept["lastTransitionTime"] == stalled_since["lastTransitionTime"]
    # Once the pod exists, the job is no longer stalled by it.
    created_now = decide(observe(body(stored(restarted)), [worker(0), worker(1)]))
    assert cond(created_now, "Stalled")[0] == "False"


@pytest.mark.parametrize(
    ("kind", "role", "field"),
    [
        ("Pod", "worker", "spec.worker.template: the API server rejected the worker pod (422)"),
        ("Job", "launcher", "spec.launcher.template: the API server rejected the launcher Job"),
        ("ConfigMap", None, "spec.worker.replicas: the API server rejected the ConfigMap"),
    ],
)
def test_a_permanent_refusal_fails_the_job_and_leaves_nothing(
    kind: str, role: str | None, field: str
) -> None:
    refusal = Refusal(kind, "x", 422 if kind != "ConfigMap" else 413, "bad", 1, role)
    plan = decide(observe(body(), [worker(0)], refusals=[refusal]))
    status = stored(plan)
    assert status["phase"] == "Failed" and status["reason"] == "InvalidSpec"
    assert field in status["message"]
    assert {d.name for d in plan.deletes} == {"j-worker-0", "j-ssh", "j-config", "j-worker"}
    assert plan.creates == []
    # A refusal of an older generation is gone once the spec changed.
    fixed = decide(observe(body(status, generation=2), [], with_infra=False, refusals=[refusal]))
    assert stored(fixed)["phase"] == "Pending"


@pytest.mark.parametrize(
    ("pod_status", "reason", "text"),
    [
        (
            {
                "conditions": [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": "0/2 nodes are available: 2 Insufficient nvidia.com/gpu.",
                    }
                ]
            },
            "Unschedulable",
            "pod j-worker-1: 0/2 nodes are available: 2 Insufficient nvidia.com/gpu.",
        ),
        (
            {
                "containerStatuses": [
                    {
                        "name": "worker",
                        "state": {
                            "waiting": {"reason": "ImagePullBackOff", "message": "Back-off x"}
                        },
                    }
                ]
            },
            "ImagePullBackOff",
            "pod j-worker-1: container worker: Back-off x",
        ),
        (
            {
                "containerStatuses": [
                    {
                        "name": "worker",
                        "state": {
                            "waiting": {
                                "reason": "CreateContainerConfigError",
                                "message": 'secret "s" not found',
                            }
                        },
                    }
                ]
            },
            "CreateContainerConfigError",
            'secret "s" not found',
        ),
    ],
)
def test_stuck_pods_are_named(pod_status: dict[str, Any], reason: str, text: str) -> None:
    stuck = worker(1, "Pending", ready=False)
    stuck["status"].update(pod_status)
    plan = decide(observe(body({**RUNNING, "phase": "Pending"}), [worker(0), stuck]))
    status, found_reason, message = cond(plan, "Stalled")
    assert (status, found_reason) == ("True", reason)
    assert text in message
    assert (stored(plan)["reason"], plan.events[0].reason) == (reason, reason)


def test_failed_mount_comes_from_the_pods_warning_events() -> None:
    warnings = {"j-worker-1": ("FailedMount", 'MountVolume.SetUp failed: secret "x" not found')}
    pods = [worker(0), worker(1, "Pending", ready=False)]
    plan = decide(observe(body({**RUNNING, "phase": "Pending"}), pods, pod_warnings=warnings))
    assert cond(plan, "Stalled")[1] == "FailedMount"
    assert "pod j-worker-1: MountVolume.SetUp failed" in cond(plan, "Stalled")[2]


def test_startup_timeout_fails_the_job_naming_what_it_waited_for() -> None:
    stuck = worker(1, "Pending", ready=False)
    stuck["status"]["conditions"].append(
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "no GPU"}
    )
    status = {**RUNNING, "phase": "Pending", "attemptStartTime": "2026-01-01T11:00:00Z"}
    plan = decide(
        observe(body(status, runPolicy={"startupTimeoutSeconds": 600}), [worker(0), stuck])
    )
    result = stored(plan)
    assert (result["phase"], result["reason"]) == ("Failed", "StartupTimeout")
    assert (
        "did not start within startupTimeoutSeconds (600s): pod j-worker-1: no GPU"
        in (result["message"])
    )
    assert {d.name for d in plan.deletes} == {"j-worker-0", "j-worker-1"}
    assert plan.creates == []


# --- edits --------------------------------------------------------------------------------

BAD_TEMPLATE = {"template": {"spec": {"containers": [None]}}}


def test_edit_row_invalid_before_start_fails_with_invalid_spec() -> None:
    plan = decide(observe(body(worker=BAD_TEMPLATE), with_infra=False))
    status = stored(plan)
    assert (status["phase"], status["reason"]) == ("Failed", "InvalidSpec")
    assert (
        "spec.worker.template: spec.containers[0] must be an object, got null"
        in (status["message"])
    )
    assert plan.creates == [] and plan.events[0] == Event(
        "Warning", "InvalidSpec", status["message"]
    )


def test_edit_row_invalid_while_running_is_rejected_and_the_job_runs_on() -> None:
    accepted = parse_job(body()).spec
    edited = body(RUNNING, generation=2, worker=BAD_TEMPLATE)
    plan = decide(observe(edited, ALL_UP, launcher_job(), accepted_spec=accepted))
    status = stored(plan)
    assert status["phase"] == "Running"
    assert status["observedGeneration"] == 1  # the edit is not acted on
    rejected = cond(plan, "SpecRejected")
    assert rejected[:2] == ("True", "InvalidSpec")
    assert "the edit of generation 2 is ignored: spec.worker.template" in rejected[2]
    assert plan.deletes == [] and plan.creates == []
    assert plan.events == [Event("Warning", "SpecRejected", rejected[2])]
    assert plan.accepted_spec is None


def test_edit_row_invalid_while_running_after_an_operator_restart_touches_nothing() -> None:
    edited = body(RUNNING, generation=2, worker=BAD_TEMPLATE)
    plan = decide(observe(edited, ALL_UP, launcher_job()))
    assert stored(plan)["phase"] == "Running"
    assert cond(plan, "SpecRejected")[0] == "True"
    assert plan.deletes == [] and plan.creates == [] and plan.requeue_after is None


def test_edit_row_replicas_while_running_without_the_crd_rule() -> None:
    plan = decide(
        observe(body(RUNNING, generation=2, worker={"replicas": 3}), ALL_UP, launcher_job())
    )
    assert stored(plan)["phase"] == "Running"
    assert stored(plan)["workers"]["replicas"] == 2
    assert cond(plan, "SpecRejected")[1] == "ReplicasImmutable"
    assert plan.deletes == [] and plan.creates == []


def test_edit_row_fixing_a_rejected_edit_clears_the_condition() -> None:
    rejected = decide(
        observe(
            body(RUNNING, generation=2, worker=BAD_TEMPLATE),
            ALL_UP,
            launcher_job(),
            accepted_spec=parse_job(body()).spec,
        )
    )
    fixed = decide(observe(body(stored(rejected), generation=3), ALL_UP, launcher_job()))
    assert cond(fixed, "SpecRejected")[:2] == ("False", "SpecAccepted")
    assert stored(fixed)["observedGeneration"] == 3


def test_edit_row_image_while_running_applies_to_the_next_attempt_only() -> None:
    plan = decide(observe(body(RUNNING, generation=2, image="img:2"), ALL_UP, launcher_job()))
    assert plan.deletes == [] and plan.creates == []
    restart = {**RUNNING, "phase": "Restarting", "restarts": 1, "launcher": None}
    next_attempt = decide(observe(body(restart, generation=2, image="img:2"), []))
    assert next_attempt.creates[0]["spec"]["containers"][0]["image"] == "img:2"


def test_edit_row_suspended_job_takes_a_new_replica_count_at_resume() -> None:
    suspended = {**RUNNING, "phase": "Suspended", "launcher": None}
    plan = decide(observe(body(suspended, worker={"replicas": 3}), []))
    assert len(created(plan)) == 3
    assert plan.config_data is not None and "j-worker-2" in plan.config_data["hostfile"]


def test_edit_row_finished_job_ignores_edits() -> None:
    done = {**RUNNING, "phase": "Succeeded", "completionTime": T0}
    plan = decide(observe(body(done, generation=5, image="other"), []))
    assert stored(plan) == status_body(HorovodJobStatus.model_validate(done))
    invalid = decide(observe(body(done, generation=5, worker=BAD_TEMPLATE), []))
    assert stored(invalid)["phase"] == "Succeeded"


def test_edit_row_fixed_spec_after_invalid_spec_starts_afresh() -> None:
    failed = stored(decide(observe(body(worker=BAD_TEMPLATE), with_infra=False)))
    plan = decide(observe(body(failed, generation=2), with_infra=False))
    assert stored(plan)["phase"] == "Pending"
    assert len(created(plan)) == 5


def test_status_of_a_newer_release_is_tolerated() -> None:
    newer = {**RUNNING, "elastic": {"size": 3}, "restarts": 0, "workers": {"replicas": 2, "x": 1}}
    plan = decide(observe(body(newer), ALL_UP, launcher_job()))
    assert stored(plan)["phase"] == "Running"
    assert plan.deletes == []


def test_the_config_map_follows_a_new_shape_only_between_attempts() -> None:
    suspended = {**RUNNING, "phase": "Suspended", "launcher": None}
    resumed = decide(observe(body(suspended, slotsPerWorker=2), []))
    assert resumed.config_data is not None and "slots=2" in resumed.config_data["hostfile"]
    running = decide(observe(body(RUNNING, slotsPerWorker=2), ALL_UP, launcher_job()))
    assert running.config_data is None


# --- disruptions and the pod failure policy -----------------------------------------------


def test_a_worker_deleted_while_running_restarts_at_once_without_counting() -> None:
    gone = worker(1, terminating=True)
    plan = decide(observe(body(RUNNING, runPolicy={"backoffLimit": 0}), [worker(0), gone]))
    status = stored(plan)
    assert status["phase"] == "Restarting"
    assert (status["restarts"], status["uncountedRestarts"]) == (1, 1)
    assert status["failures"][0]["pod"] == "j-worker-1"
    assert status["failures"][0]["reason"] == "PodDeleted"
    assert "not counted (0 of backoffLimit 0 used)" in status["message"]
    vanished = decide(observe(body(RUNNING), [worker(0)], launcher_job()))
    assert stored(vanished)["failures"][0]["message"] == (
        "the pod disappeared while the attempt ran"
    )


DISRUPTED = {
    "conditions": [
        {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}
    ]
}


@pytest.mark.parametrize(
    ("rules", "failed", "phase", "restarts", "uncounted", "reason"),
    [
        ([], {"reason": "OOMKilled"}, "Restarting", 1, 0, "WorkerFailed"),
        ([], DISRUPTED, "Restarting", 1, 1, "WorkerFailed"),
        (
            [{"action": "Count", "onPodConditions": [{"type": "DisruptionTarget"}]}],
            DISRUPTED,
            "Restarting",
            1,
            0,
            "WorkerFailed",
        ),
        (
            [{"action": "FailJob", "onExitCodes": {"operator": "In", "values": [42]}}],
            {"exit": 42},
            "Failed",
            0,
            0,
            "PodFailurePolicy",
        ),
        (
            [{"action": "Ignore", "onExitCodes": {"operator": "In", "values": [143]}}],
            {"exit": 143},
            "Restarting",
            1,
            1,
            "WorkerFailed",
        ),
        (
            [{"action": "FailJob", "onExitCodes": {"operator": "NotIn", "values": [1]}}],
            {"exit": 1},
            "Restarting",
            1,
            0,
            "WorkerFailed",
        ),
        (
            [
                {
                    "action": "FailJob",
                    "onExitCodes": {"containerName": "launcher", "operator": "In", "values": [3]},
                }
            ],
            {"exit": 3},
            "Restarting",
            1,
            0,
            "WorkerFailed",
        ),
    ],
)
def test_pod_failure_policy(
    rules: list[dict[str, Any]],
    failed: dict[str, Any],
    phase: str,
    restarts: int,
    uncounted: int,
    reason: str,
) -> None:
    pod = worker(1, "Failed")
    failed = dict(failed)
    code = failed.pop("exit", None)
    if code is not None:
        pod["status"]["containerStatuses"] = [
            {"name": "worker", "state": {"terminated": {"exitCode": code, "reason": "Error"}}}
        ]
    pod["status"].update(failed)
    policy = {"backoffLimit": 1, "podFailurePolicy": {"rules": rules}}
    plan = decide(observe(body(RUNNING, runPolicy=policy), [worker(0), pod], launcher_job()))
    status = stored(plan)
    assert (status["phase"], status["restarts"], status["uncountedRestarts"]) == (
        phase,
        restarts,
        uncounted,
    )
    assert status["reason"] == reason
    if phase == "Failed":
        assert "podFailurePolicy rule 0 (FailJob)" in status["message"]


def test_only_counted_restarts_spend_the_backoff_limit() -> None:
    many = {**RUNNING, "restarts": 5, "uncountedRestarts": 5}
    pods = [worker(0, attempt=5), worker(1, "Failed", attempt=5, reason="OOMKilled")]
    plan = decide(observe(body(many, runPolicy={"backoffLimit": 1}), pods))
    status = stored(plan)
    assert (status["phase"], status["restarts"]) == ("Restarting", 6)
    assert "restart 1 of 1" in status["message"]


def test_a_rule_needs_exactly_one_matcher() -> None:
    with pytest.raises(ValueError, match="exactly one of onExitCodes and onPodConditions"):
        parse_job(body(runPolicy={"podFailurePolicy": {"rules": [{"action": "Ignore"}]}}))


# --- lost nodes ---------------------------------------------------------------------------


def test_a_pod_stuck_terminating_past_its_grace_is_force_deleted() -> None:
    stuck = worker(1, terminating=True)
    stuck["metadata"]["deletionTimestamp"] = "2026-01-01T11:58:00Z"  # 120 s ago
    stuck["spec"]["nodeName"] = "lost-node"
    status = {**RUNNING, "phase": "Restarting", "restarts": 1, "launcher": None}
    plan = decide(observe(body(status), [stuck]))
    (force,) = [d for d in plan.deletes if d.grace_period == 0]
    assert force.name == "j-worker-1"
    assert force.warning is not None and "node lost-node not responding" in force.warning
    recent = worker(1, terminating=True)  # deleted now: wait out the grace first
    waiting = decide(observe(body(status), [recent]))
    assert not [d for d in waiting.deletes if d.grace_period == 0]
    assert waiting.requeue_after == pytest.approx(60.5)


# --- the opt-in template policy -----------------------------------------------------------


@pytest.mark.parametrize(
    ("template", "rule"),
    [
        ({"spec": {"serviceAccountName": "admin"}}, "rule ServiceAccount"),
        (
            {"spec": {"hostNetwork": True}},
            "rule HostNamespaces: spec.worker.template.spec.hostNetwork",
        ),
        (
            {"spec": {"volumes": [{"name": "root", "hostPath": {"path": "/"}}]}},
            "rule HostPath: spec.worker.template.spec.volumes 'root' is a hostPath",
        ),
        (
            {"spec": {"containers": [{"name": "w", "securityContext": {"privileged": True}}]}},
            "rule Privileged: spec.worker.template container 'w' is privileged",
        ),
        (
            {"spec": {"volumes": [{"name": "k", "secret": {"secretName": "other-ssh"}}]}},
            "rule OtherJobSecret: spec.worker.template mounts Secret 'other-ssh'",
        ),
        (
            {
                "spec": {
                    "containers": [{"name": "w", "envFrom": [{"secretRef": {"name": "other-ssh"}}]}]
                }
            },
            "rule OtherJobSecret: spec.worker.template reads Secret 'other-ssh'",
        ),
        # The bypasses of the first version of the policy (issue #34).
        (
            {
                "spec": {
                    "volumes": [
                        {"name": "p", "projected": {"sources": [{"secret": {"name": "other-ssh"}}]}}
                    ]
                }
            },
            "rule OtherJobSecret: spec.worker.template mounts Secret 'other-ssh'",
        ),
        (
            {
                "spec": {
                    "containers": [{"name": "w", "ports": [{"containerPort": 22, "hostPort": 22}]}]
                }
            },
            "rule HostPort: spec.worker.template container 'w' asks for hostPort 22",
        ),
        ({"spec": {"nodeName": "gpu-node-7"}}, "rule NodeName: spec.worker.template.spec.nodeName"),
        (
            {"spec": {"volumes": [{"name": "d", "csi": {"driver": "x.example.com"}}]}},
            "rule VolumeType: spec.worker.template.spec.volumes 'd' is a csi volume",
        ),
        (
            {"spec": {"volumes": [{"name": "d", "nfs": {"server": "nas", "path": "/"}}]}},
            "rule VolumeType: spec.worker.template.spec.volumes 'd' is a nfs volume",
        ),
        (
            {
                "spec": {
                    "volumes": [{"name": "d", "iscsi": {"targetPortal": "t", "iqn": "i", "lun": 0}}]
                }
            },
            "rule VolumeType: spec.worker.template.spec.volumes 'd' is a iscsi volume",
        ),
    ],
)
def test_the_template_policy_refuses_what_a_pod_author_could_not_do(
    template: dict[str, Any], rule: str
) -> None:
    job = body(worker={"template": template})
    allowed = decide(observe(job, with_infra=False))
    assert stored(allowed)["phase"] == "Pending"  # the policy is opt-in
    refused = decide(observe(job, with_infra=False, restrict_templates=True))
    status = stored(refused)
    assert (status["phase"], status["reason"]) == ("Failed", "InvalidSpec")
    assert rule in status["message"]
    own = body(
        worker={
            "template": {"spec": {"volumes": [{"name": "k", "secret": {"secretName": "j-ssh"}}]}}
        }
    )
    assert (
        stored(decide(observe(own, with_infra=False, restrict_templates=True)))["phase"]
        == "Pending"
    )


def test_the_template_policy_allows_the_volumes_a_restricted_pod_may_use() -> None:
    volumes = [
        {"name": "c", "configMap": {"name": "data"}},
        {"name": "d", "downwardAPI": {"items": []}},
        {"name": "e", "emptyDir": {"medium": "Memory"}},
        {"name": "p", "persistentVolumeClaim": {"claimName": "datasets"}},
        {"name": "t", "projected": {"sources": [{"serviceAccountToken": {"path": "t"}}]}},
        {"name": "s", "secret": {"secretName": "wandb"}},
        {"name": "x", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}},
    ]
    job = body(worker={"template": {"spec": {"volumes": volumes}}})
    status = stored(decide(observe(job, with_infra=False, restrict_templates=True)))
    assert status["phase"] == "Pending", status


def test_the_template_policy_rejects_an_edit_of_a_running_job() -> None:
    edited = body(RUNNING, generation=2, worker={"template": {"spec": {"hostPID": True}}})
    plan = decide(
        observe(
            edited,
            ALL_UP,
            launcher_job(),
            restrict_templates=True,
            accepted_spec=parse_job(body()).spec,
        )
    )
    assert stored(plan)["phase"] == "Running"
    assert "rule HostNamespaces" in cond(plan, "SpecRejected")[2]
    assert plan.deletes == []


# --- gang scheduling ----------------------------------------------------------------------


def test_a_gang_is_created_before_its_workers_which_join_it() -> None:
    plan = decide(observe(body(), gang_api=True))
    assert created(plan) == ["PodGroup/j-gang-0-2", "Pod/j-worker-0", "Pod/j-worker-1"]
    group = plan.creates[0]
    assert group["apiVersion"] == "scheduling.k8s.io/v1beta1"
    assert group["spec"] == {"schedulingPolicy": {"gang": {"minCount": 2}}}
    assert group["metadata"]["ownerReferences"][0]["uid"] == UID
    for pod in plan.creates[1:]:
        assert pod["spec"]["schedulingGroup"] == {"podGroupName": "j-gang-0-2"}


def test_a_gang_takes_min_available_and_the_priority_class() -> None:
    job = body(
        worker={"replicas": 4},
        scheduling={"priorityClassName": "high", "gang": {"minAvailable": 3}},
    )
    group = decide(observe(job, with_infra=False, gang_api=True)).creates[3]
    assert group["kind"] == "PodGroup"
    assert group["spec"] == {
        "schedulingPolicy": {"gang": {"minCount": 3}},
        "priorityClassName": "high",
    }


def test_a_restarted_attempt_forms_a_new_gang() -> None:
    status = {**RUNNING, "phase": "Restarting", "restarts": 1, "launcher": None}
    plan = decide(observe(body(status), [], gang_api=True))
    assert created(plan) == ["PodGroup/j-gang-1-2", "Pod/j-worker-0", "Pod/j-worker-1"]
    assert plan.creates[1]["spec"]["schedulingGroup"] == {"podGroupName": "j-gang-1-2"}


@pytest.mark.parametrize(("policy", "served"), [("Auto", False), ("None", True)])
def test_no_gang_without_the_api_or_when_turned_off(policy: str, served: bool) -> None:
    plan = decide(observe(body(scheduling={"gang": {"policy": policy}}), gang_api=served))
    assert created(plan) == ["Pod/j-worker-0", "Pod/j-worker-1"]
    assert all("schedulingGroup" not in pod["spec"] for pod in plan.creates)


def test_a_required_gang_on_a_cluster_without_the_api_creates_no_worker_and_says_why() -> None:
    plan = decide(observe(body(scheduling={"gang": {"policy": "Native"}})))
    assert created(plan) == []
    state, reason, message = cond(plan, "Stalled")
    assert (state, reason) == ("True", "GangSchedulingUnavailable")
    assert "GenericWorkload" in message and "policy to Auto" in message
    assert stored(plan)["reason"] == "GangSchedulingUnavailable"
    assert [e.reason for e in plan.events] == ["GangSchedulingUnavailable"]


def test_the_workers_still_missing_in_a_gang_get_their_group_again() -> None:
    # One worker was created, the other refused: its retry names the same group
    # (a 409 on the group is ours and is fine).
    pending = {**RUNNING, "phase": "Pending", "launcher": None}
    plan = decide(observe(body(pending), [worker(0, phase="Pending", ready=False)], gang_api=True))
    assert created(plan) == ["PodGroup/j-gang-0-2", "Pod/j-worker-1"]


def test_a_resume_with_fewer_workers_forms_a_gang_of_the_new_size() -> None:
    # Suspended with 4 workers, resumed with 2: the old group (minCount 4, its spec
    # immutable) would hold the 2 new pods back forever.
    before = decide(observe(body(worker={"replicas": 4}), with_infra=False, gang_api=True))
    assert "PodGroup/j-gang-0-4" in created(before)
    suspended = {**RUNNING, "phase": "Suspended", "launcher": None, "workers": {"replicas": 4}}
    resumed = decide(observe(body(suspended), [], gang_api=True))
    assert stored(resumed)["phase"] == "Pending"
    group = resumed.creates[0]
    assert group["metadata"]["name"] == "j-gang-0-2"
    assert group["spec"]["schedulingPolicy"] == {"gang": {"minCount": 2}}
    assert resumed.creates[1]["spec"]["schedulingGroup"] == {"podGroupName": "j-gang-0-2"}


# --- Kueue: one Workload per job ----------------------------------------------------------

QUEUE = {"queue": "gpus"}
A100 = {
    "kind": "ResourceFlavor",
    "metadata": {"name": "a100"},
    "spec": {
        "nodeLabels": {"gpu": "a100"},
        "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
    },
}


def workload(*conditions: tuple[str, str, str], admitted_to: str | None = None) -> dict[str, Any]:
    """The job's Workload as the slim index keeps it, with (type, status, reason) conditions."""
    status: dict[str, Any] = {
        "conditions": [
            {
                "type": t,
                "status": s,
                "reason": r,
                "message": f"{r} message",
                "lastTransitionTime": T0,
            }
            for t, s, r in conditions
        ]
    }
    if admitted_to is not None:
        status["admission"] = {
            "clusterQueue": "cq",
            "podSetAssignments": [
                {"name": "worker", "flavors": {"nvidia.com/gpu": admitted_to}, "count": 2},
                {"name": "launcher", "flavors": {"cpu": admitted_to}, "count": 1},
            ],
        }
    return {
        "kind": "Workload",
        "metadata": {
            "name": "hvjob-j-0",
            "ownerReferences": owned(),
            "resourceVersion": "7",
            "generation": 1,
        },
        "spec": {"queueName": "gpus"},
        "status": status,
    }


ADMITTED_WL = (("QuotaReserved", "True", "QuotaReserved"), ("Admitted", "True", "Admitted"))
SUSPENDED = {**RUNNING, "phase": "Suspended", "launcher": None, "reason": "QueuedByKueue"}


def kueue(job: dict[str, Any], pods: list[dict[str, Any]] | None = None, **extra: Any) -> Plan:
    wl = extra.pop("wl", None)
    objects = {"Workload": [wl]} if wl is not None else {}
    return decide(observe(job, pods, objects=objects, kueue_api=True, **extra))


def test_a_queued_job_gets_a_workload_and_no_pods() -> None:
    job = body(worker={"resources": {"limits": {"nvidia.com/gpu": 2}}}, scheduling=QUEUE)
    plan = kueue(job, with_infra=False)
    assert created(plan) == ["Workload/hvjob-j-0"]
    wl = plan.creates[0]
    assert wl["apiVersion"] == "kueue.x-k8s.io/v1beta2"
    assert wl["metadata"]["ownerReferences"][0]["uid"] == UID
    assert wl["spec"]["queueName"] == "gpus"
    worker_set, launcher_set = wl["spec"]["podSets"]
    assert (worker_set["name"], worker_set["count"]) == ("worker", 2)
    assert (launcher_set["name"], launcher_set["count"]) == ("launcher", 1)
    resources = worker_set["template"]["spec"]["containers"][0]["resources"]
    # Kueue counts requests: limits alone are requested as much.
    assert resources["requests"] == {"nvidia.com/gpu": 2}
    assert stored(plan)["phase"] == "Suspended"
    assert stored(plan)["reason"] == "QueuedByKueue"
    assert "queue gpus" in stored(plan)["message"]
    assert "startTime" not in stored(plan)


def test_a_job_waiting_in_the_queue_says_what_kueue_says() -> None:
    pending = workload(("QuotaReserved", "False", "Pending"))
    plan = kueue(body(SUSPENDED, scheduling=QUEUE), wl=pending)
    assert created(plan) == [] and plan.deletes == []
    assert stored(plan)["phase"] == "Suspended"
    assert stored(plan)["reason"] == "QueuedByKueue"
    assert stored(plan)["message"] == (
        "Workload hvjob-j-0 waits in queue gpus for Kueue to admit it: Pending message"
    )
    assert stored(plan)["restarts"] == 0


def test_a_required_topology_kueue_cannot_place_is_named_in_the_message() -> None:
    pending = workload(("QuotaReserved", "False", "Pending"))
    pending["spec"]["podSets"] = [
        {"name": "worker", "count": 3, "topologyRequest": {"required": "rack"}},
        {"name": "launcher", "count": 1},
    ]
    message = stored(kueue(body(SUSPENDED, scheduling=QUEUE), wl=pending))["message"]
    assert message == (
        "Workload hvjob-j-0 waits in queue gpus for Kueue to admit it: Pending message "
        "(spec.scheduling.topology Required: its 3 worker pods must fit in one rack "
        "domain; Preferred lets them spread)"
    )


def test_an_admitted_job_starts_on_the_admitted_flavor() -> None:
    admitted = workload(*ADMITTED_WL, admitted_to="a100")
    plan = kueue(body(SUSPENDED, scheduling=QUEUE), [], wl=admitted, flavors={"a100": A100})
    assert stored(plan)["phase"] == "Pending"
    assert created(plan) == ["Pod/j-worker-0", "Pod/j-worker-1"]
    for pod in plan.creates:
        assert pod["spec"]["nodeSelector"] == {"gpu": "a100"}
        assert pod["spec"]["tolerations"] == [
            {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}
        ]
        # The Workload is the job's claim on quota: no pod is a second one.
        assert "kueue.x-k8s.io/queue-name" not in pod["metadata"]["labels"]
    assert plan.events == [Event("Normal", "JobResumed", "the job is resumed")]


def test_the_launcher_of_an_admitted_job_goes_where_its_pod_set_was_admitted() -> None:
    admitted = workload(*ADMITTED_WL, admitted_to="a100")
    starting = {**RUNNING, "phase": "Starting", "launcher": None}
    plan = kueue(
        body(starting, scheduling=QUEUE),
        [worker(0), worker(1)],
        wl=admitted,
        flavors={"a100": A100},
    )
    assert created(plan) == ["Job/j-launcher"]
    assert plan.creates[0]["spec"]["template"]["spec"]["nodeSelector"] == {"gpu": "a100"}


def test_an_admitted_job_waits_for_its_flavor_to_be_read() -> None:
    admitted = workload(*ADMITTED_WL, admitted_to="a100")
    plan = kueue(body(SUSPENDED, scheduling=QUEUE), [], wl=admitted)
    assert created(plan) == [] and plan.deletes == []
    assert plan.requeue_after is not None


def test_an_evicted_job_loses_its_pods_but_is_not_failed() -> None:
    evicted = workload(*ADMITTED_WL, ("Evicted", "True", "Preempted"), admitted_to="a100")
    running = {**RUNNING, "restarts": 0}
    plan = kueue(body(running, scheduling=QUEUE), ALL_UP, ljob=launcher_job(), wl=evicted)
    status = stored(plan)
    assert status["phase"] == "Suspended"
    assert status["reason"] == "EvictedByKueue"
    assert "Preempted" in status["message"]
    # A new attempt, counted as a restart that is not a failure.
    assert (status["restarts"], status["uncountedRestarts"]) == (1, 1)
    # The launcher's pod goes with its Job (foreground).
    assert sorted(d.name for d in plan.deletes) == ["j-launcher", "j-worker-0", "j-worker-1"]
    assert "Failed" not in [c.type for c in plan.status.conditions if c.status == "True"]  # type: ignore[union-attr]
    # The quota stays reserved while the pods go.
    assert plan.workload_status is None


def test_an_evicted_job_without_pods_gives_its_admission_back() -> None:
    evicted = workload(*ADMITTED_WL, ("Evicted", "True", "Preempted"), admitted_to="a100")
    was_evicted = {**SUSPENDED, "reason": "EvictedByKueue", "restarts": 1, "uncountedRestarts": 1}
    plan = kueue(body(was_evicted, scheduling=QUEUE), [], wl=evicted)
    patch = plan.workload_status
    assert patch is not None and patch.clear_admission
    assert (patch.name, patch.resource_version) == ("hvjob-j-0", "7")
    by_type = {c["type"]: (c["status"], c["reason"]) for c in patch.conditions}
    assert by_type["QuotaReserved"] == ("False", "Pending")
    assert by_type["Admitted"] == ("False", "NoReservation")
    assert by_type["Requeued"] == ("True", "Preempted")
    assert by_type["Evicted"] == ("True", "Preempted")
    assert stored(plan)["restarts"] == 1  # counted once, when the attempt ended
    assert created(plan) == []


def test_a_readmitted_job_resumes_as_its_new_attempt() -> None:
    admitted = workload(*ADMITTED_WL, admitted_to="a100")
    was_evicted = {**SUSPENDED, "restarts": 1, "uncountedRestarts": 1}
    plan = kueue(body(was_evicted, scheduling=QUEUE), [], wl=admitted, flavors={"a100": A100})
    assert stored(plan)["phase"] == "Pending"
    assert [p["metadata"]["labels"]["horovod.ai/attempt"] for p in plan.creates] == ["1", "1"]
    # The same Workload, admitted again: no new one.
    assert "Workload/hvjob-j-0" not in created(plan) and "Workload/hvjob-j-1" not in created(plan)


@pytest.mark.parametrize(
    ("condition", "reason"), [("Succeeded", "Succeeded"), ("Failed", "Failed")]
)
def test_a_finished_job_finishes_its_workload(condition: str, reason: str) -> None:
    admitted = workload(*ADMITTED_WL, admitted_to="a100")
    running = {**RUNNING}
    if condition == "Succeeded":
        plan = kueue(
            body(running, scheduling=QUEUE),
            [worker(0), worker(1), launcher_pod("Succeeded")],
            ljob=launcher_job("Complete"),
            wl=admitted,
        )
    else:
        plan = kueue(
            body(running, runPolicy={"backoffLimit": 0}, scheduling=QUEUE),
            [worker(0, phase="Failed", ready=False), worker(1), launcher_pod()],
            ljob=launcher_job(),
            wl=admitted,
        )
    assert stored(plan)["phase"] == condition
    patch = plan.workload_status
    assert patch is not None and not patch.clear_admission
    finished = next(c for c in patch.conditions if c["type"] == "Finished")
    assert (finished["status"], finished["reason"]) == ("True", reason)
    assert finished["lastTransitionTime"] == NOW_S


def test_a_finished_workload_is_finished_once() -> None:
    done = workload(*ADMITTED_WL, ("Finished", "True", "Succeeded"), admitted_to="a100")
    succeeded = {**RUNNING, "phase": "Succeeded", "completionTime": NOW_S}
    plan = kueue(body(succeeded, scheduling=QUEUE), [], wl=done)
    assert plan.workload_status is None


# --- Kueue's PodsReady: what waitForPodsReady times ----------------------------------------


def pods_ready(plan: Plan) -> tuple[str, str] | None:
    """The PodsReady (status, reason) the plan writes to the Workload, or None."""
    patch = plan.workload_status
    if patch is None:
        return None
    found = next((c for c in patch.conditions if c["type"] == "PodsReady"), None)
    return None if found is None else (found["status"], found["reason"])


STARTING = {**RUNNING, "phase": "Starting", "launcher": None}


def test_an_admitted_job_whose_pods_are_not_ready_says_wait_for_start() -> None:
    admitted = workload(*ADMITTED_WL, admitted_to="a100")
    plan = kueue(body(STARTING, scheduling=QUEUE), [worker(0), worker(1, ready=False)], wl=admitted)
    assert pods_ready(plan) == ("False", "WaitForStart")
    assert plan.workload_status is not None and not plan.workload_status.clear_admission
    # Written once: the same state again writes nothing.
    waiting = workload(*ADMITTED_WL, ("PodsReady", "False", "WaitForStart"), admitted_to="a100")
    plan = kueue(body(STARTING, scheduling=QUEUE), [worker(0), worker(1, ready=False)], wl=waiting)
    assert plan.workload_status is None


def test_a_queued_job_writes_no_pods_ready() -> None:
    pending = workload(("QuotaReserved", "False", "Pending"))
    assert kueue(body(SUSPENDED, scheduling=QUEUE), wl=pending).workload_status is None


def test_every_worker_ready_and_the_launcher_running_is_started() -> None:
    waiting = workload(*ADMITTED_WL, ("PodsReady", "False", "WaitForStart"), admitted_to="a100")
    plan = kueue(body(RUNNING, scheduling=QUEUE), ALL_UP, ljob=launcher_job(), wl=waiting)
    assert stored(plan)["phase"] == "Running"
    assert pods_ready(plan) == ("True", "Started")
    ready = next(c for c in plan.workload_status.conditions if c["type"] == "PodsReady")  # type: ignore[union-attr]
    assert ready["lastTransitionTime"] == NOW_S
    started = workload(*ADMITTED_WL, ("PodsReady", "True", "Started"), admitted_to="a100")
    plan = kueue(body(RUNNING, scheduling=QUEUE), ALL_UP, ljob=launcher_job(), wl=started)
    assert plan.workload_status is None


def test_a_launcher_running_before_its_workers_are_ready_is_not_started() -> None:
    # launcherCreationPolicy AtStartup: the launcher runs while a worker is not Ready.
    waiting = workload(*ADMITTED_WL, ("PodsReady", "False", "WaitForStart"), admitted_to="a100")
    pods = [worker(0), worker(1, ready=False), launcher_pod()]
    plan = kueue(body(RUNNING, scheduling=QUEUE), pods, ljob=launcher_job(), wl=waiting)
    assert plan.workload_status is None


def test_a_failed_attempt_waits_for_recovery_and_then_recovers() -> None:
    started = workload(*ADMITTED_WL, ("PodsReady", "True", "Started"), admitted_to="a100")
    failed = [worker(0, phase="Failed", ready=False), worker(1), launcher_pod()]
    plan = kueue(body(RUNNING, scheduling=QUEUE), failed, ljob=launcher_job(), wl=started)
    assert stored(plan)["phase"] == "Restarting"
    assert pods_ready(plan) == ("False", "WaitForRecovery")
    # The next attempt is Pending: still recovering (Kueue's recoveryTimeout runs).
    recovering = workload(
        *ADMITTED_WL, ("PodsReady", "False", "WaitForRecovery"), admitted_to="a100"
    )
    pending = {**STARTING, "phase": "Pending", "restarts": 1}
    plan = kueue(body(pending, scheduling=QUEUE), [], wl=recovering, flavors={"a100": A100})
    assert plan.workload_status is None
    # Up again: Recovered, as Kueue's job framework says it.
    running = {**RUNNING, "restarts": 1}
    pods = [worker(0, attempt=1), worker(1, attempt=1), launcher_pod()]
    for pod in pods:
        pod["metadata"]["labels"]["horovod.ai/attempt"] = "1"
    plan = kueue(body(running, scheduling=QUEUE), pods, ljob=launcher_job(attempt=1), wl=recovering)
    assert stored(plan)["phase"] == "Running"
    assert pods_ready(plan) == ("True", "Recovered")


def test_a_requeued_workload_waits_for_start_again() -> None:
    evicted = workload(
        *ADMITTED_WL,
        ("PodsReady", "False", "WaitForStart"),
        ("Evicted", "True", "PodsReadyTimeout"),
        admitted_to="a100",
    )
    was_evicted = {**SUSPENDED, "reason": "EvictedByKueue", "restarts": 1, "uncountedRestarts": 1}
    plan = kueue(body(was_evicted, scheduling=QUEUE), [], wl=evicted)
    assert plan.workload_status is not None and plan.workload_status.clear_admission
    assert pods_ready(plan) == ("False", "WaitForStart")
    by_type = {c["type"]: (c["status"], c["reason"]) for c in plan.workload_status.conditions}
    # Not a preemption: Kueue's own backoff decides when it queues again.
    assert by_type["Requeued"] == ("False", "PodsReadyTimeout")


def test_a_job_in_kueues_backoff_says_until_when() -> None:
    requeued = workload(
        ("QuotaReserved", "False", "Pending"), ("Requeued", "False", "PodsReadyTimeout")
    )
    requeued["status"]["requeueState"] = {"count": 2, "requeueAt": "2026-01-01T00:05:00Z"}
    plan = kueue(body(SUSPENDED, scheduling=QUEUE), wl=requeued)
    assert stored(plan)["message"] == (
        "Workload hvjob-j-0 waits in queue gpus for Kueue to admit it: Pending message; "
        "Kueue queues it again after its backoff, at 2026-01-01T00:05:00Z (eviction 2)"
    )
    requeued["spec"]["active"] = False
    message = stored(kueue(body(SUSPENDED, scheduling=QUEUE), wl=requeued))["message"]
    assert "Kueue deactivated it (PodsReadyTimeout message)" in message
    assert "kubectl patch workload hvjob-j-0" in message


def test_an_elastic_job_is_started_at_min_replicas() -> None:
    # (Elastic jobs cannot be queued yet; the rule is ready for when they can.)
    job = parse_job(body(launchMode="gloo", elastic={"minReplicas": 1, "maxReplicas": 3}))
    status = parse_status({**RUNNING, "workers": {"replicas": 3, "ready": 1}})
    assert status is not None and queueing.pods_started(job, status)
    status.workers.ready = 0  # type: ignore[union-attr]
    assert not queueing.pods_started(job, status)


def test_a_workload_priority_class_is_the_workloads_not_the_pods() -> None:
    job = body(scheduling={"queue": "gpus", "priorityClassName": "urgent"})
    missing = kueue(job, with_infra=False)
    assert created(missing) == []
    assert stored(missing)["reason"] == "PriorityClassNotFound"
    urgent = Priority("kueue.x-k8s.io", "WorkloadPriorityClass", "urgent", 1000)
    plan = kueue(job, with_infra=False, priority=urgent)
    spec = plan.creates[0]["spec"]
    assert spec["priorityClassRef"] == {
        "group": "kueue.x-k8s.io",
        "kind": "WorkloadPriorityClass",
        "name": "urgent",
    }
    assert spec["priority"] == 1000
    assert "priorityClassName" not in spec["podSets"][0]["template"]["spec"]
    # Nor on the gang of its admitted pods: the API server knows no such PriorityClass.
    admitted = workload(*ADMITTED_WL, admitted_to="a100")
    admitted["spec"]["priorityClassRef"] = {"kind": "WorkloadPriorityClass", "name": "urgent"}
    suspended = body(SUSPENDED, scheduling={"queue": "gpus", "priorityClassName": "urgent"})
    started = kueue(suspended, [], wl=admitted, flavors={"a100": A100}, gang_api=True)
    assert created(started) == ["PodGroup/j-gang-0-2", "Pod/j-worker-0", "Pod/j-worker-1"]
    assert all("priorityClassName" not in obj["spec"] for obj in started.creates)


def test_without_kueue_the_queue_is_only_a_label() -> None:
    plan = decide(observe(body(scheduling=QUEUE)))
    assert created(plan) == ["Pod/j-worker-0", "Pod/j-worker-1"]
    assert plan.creates[0]["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpus"


def test_a_startup_timeout_names_the_refusal_that_held_the_job() -> None:
    refusal = Refusal("Pod", "j-worker-1", 503, "the server is currently unable", 1, "worker")
    held = decide(observe(body(), [worker(0)], refusals=[refusal]))
    late = NOW + timedelta(seconds=1300)
    timed_out = decide(
        observe(body(stored(held), runPolicy={"startupTimeoutSeconds": 1200}), [worker(0)],
                refusals=[refusal], now=late)
    )  # fmt: skip
    status = stored(timed_out)
    assert (status["phase"], status["reason"]) == ("Failed", "StartupTimeout")
    assert (
        "refused to create Pod j-worker-1 (503): the server is currently unable"
        in (status["message"])
    )
