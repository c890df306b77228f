"""MultiKueue, decided without a cluster: the manager's copy of a job gets its
Workload once and nothing else; the worker's copy adopts MultiKueue's Workload and
never makes its own (tests/operator/integration/test_multikueue.py runs both
against two real control planes with real Kueue)."""

from __future__ import annotations

from typing import Any

from horovod_operator.decide import decide
from horovod_operator.multikueue import MULTIKUEUE, PREBUILT_WORKLOAD_LABEL
from horovod_operator.plan import Plan
from tests.operator.test_decide import (
    ADMITTED_WL,
    QUEUE,
    SUSPENDED,
    UID,
    body,
    created,
    kueue,
    observe,
    stored,
    workload,
)


def dispatched(status: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    return body(status, managedBy=MULTIKUEUE, **spec)


def manager(job: dict[str, Any], wl: dict[str, Any] | None = None, **extra: Any) -> Plan:
    """What the manager's operator sees of a dispatched job: its Workloads only."""
    objects = {"Workload": [wl]} if wl is not None else {}
    extra.setdefault("kueue_api", True)
    return decide(observe(job, with_infra=False, objects=objects, **extra))


def test_the_manager_creates_the_workload_and_nothing_else() -> None:
    plan = manager(
        dispatched(scheduling=QUEUE, worker={"resources": {"limits": {"nvidia.com/gpu": 2}}})
    )
    assert created(plan) == ["Workload/hvjob-j-0"]
    wl = plan.creates[0]
    assert wl["metadata"]["ownerReferences"][0]["uid"] == UID  # Kueue finds the adapter by it
    assert wl["spec"]["queueName"] == "gpus"
    assert [(p["name"], p["count"]) for p in wl["spec"]["podSets"]] == [
        ("worker", 2),
        ("launcher", 1),
    ]
    # MultiKueue mirrors the worker's status onto the job: nothing written here.
    assert plan.status is None and plan.events == [] and plan.workload_status is None


def test_the_manager_creates_the_workload_once() -> None:
    running = {"phase": "Running", "restarts": 2}  # mirrored from the worker
    for wl in (workload(*ADMITTED_WL), workload(("Finished", "True", "Succeeded"))):
        plan = manager(dispatched(running, scheduling=QUEUE), wl)
        assert plan == Plan(), wl
    # Finished where it ran, and its Workload deleted by hand: not dispatched again.
    assert manager(dispatched({"phase": "Succeeded"}, scheduling=QUEUE)) == Plan()


def test_the_manager_says_why_a_job_is_not_dispatched() -> None:
    cases: list[tuple[dict[str, Any], bool, str]] = [
        (dispatched(), True, "spec.scheduling.queue is unset"),
        (dispatched(scheduling=QUEUE), False, "serves no Kueue Workload API"),
        (dispatched(scheduling=QUEUE, worker={"replicas": 0}), True, "worker.replicas"),
    ]
    for job, kueue_api, why in cases:
        plan = manager(job, kueue_api=kueue_api)
        assert plan.creates == [] and plan.status is None
        assert [e.type for e in plan.events] == ["Warning"], plan.events
        assert why in plan.events[0].message, plan.events[0].message
    # Discovery has not answered: nothing yet (it reconciles every job when it does).
    assert manager(dispatched(scheduling=QUEUE), kueue_api=None) == Plan()


def test_the_manager_waits_for_the_priority_class() -> None:
    plan = manager(dispatched(scheduling={**QUEUE, "priorityClassName": "high"}))
    assert plan.creates == [] and plan.requeue_after is not None


def worker_copy(status: dict[str, Any] | None = None) -> dict[str, Any]:
    """The job as MultiKueue creates it on a worker: no managedBy, the label."""
    job = body(status, scheduling=QUEUE)
    job["metadata"]["labels"] = {PREBUILT_WORKLOAD_LABEL: "hvjob-j-0"}
    return job


def prebuilt(owner: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    wl = workload(*ADMITTED_WL)
    wl["metadata"]["ownerReferences"] = owner or []
    return wl


def test_the_worker_adopts_multikueues_workload() -> None:
    plan = kueue(worker_copy(), wl=prebuilt(), with_infra=False)
    assert plan.creates == []
    assert plan.workload_adopt is not None
    assert plan.workload_adopt.name == "hvjob-j-0"
    assert plan.workload_adopt.resource_version == "7"
    assert plan.workload_adopt.owner["uid"] == UID and plan.workload_adopt.owner["controller"]
    assert stored(plan)["reason"] == "QueuedByKueue"
    assert "made by MultiKueue" in stored(plan)["message"]


def test_the_worker_runs_on_the_adopted_workload() -> None:
    plan = kueue(worker_copy(SUSPENDED), [], wl=workload(*ADMITTED_WL))
    assert plan.workload_adopt is None
    assert created(plan) == ["Pod/j-worker-0", "Pod/j-worker-1"]


def test_the_worker_never_creates_a_workload_of_its_own() -> None:
    plan = kueue(worker_copy(), with_infra=False)
    assert plan.creates == [] and plan.workload_adopt is None
    assert "waits for MultiKueue to create it" in stored(plan)["message"]
    # After a restart the attempt's own name would differ: still MultiKueue's only.
    restarted = kueue(worker_copy({**SUSPENDED, "restarts": 1}), wl=workload(*ADMITTED_WL))
    assert not [o for o in restarted.creates if o["kind"] == "Workload"]


def test_the_worker_leaves_a_workload_another_controller_holds() -> None:
    other = [{"kind": "Job", "name": "x", "uid": "someone-else", "controller": True}]
    plan = kueue(worker_copy(), wl=prebuilt(other), with_infra=False)
    assert plan.creates == [] and plan.workload_adopt is None
    assert stored(plan)["reason"] == "ChildConflict"


def test_a_rejected_admission_check_is_named_with_its_fix() -> None:
    """A job without managedBy in a MultiKueue queue: Kueue rejects the check and
    deactivates the Workload; re-activating it would be rejected again."""
    wl = workload(("QuotaReserved", "False", "Pending"))
    wl["spec"]["active"] = False
    wl["status"]["admissionChecks"] = [
        {
            "name": "multikueue",
            "state": "Rejected",
            "message": 'Expecting .spec.managedBy to be "kueue.x-k8s.io/multikueue" not ""',
        }
    ]
    message = stored(kueue(body(SUSPENDED, scheduling=QUEUE), wl=wl))["message"]
    assert "admission check multikueue rejected it (Expecting .spec.managedBy" in message
    assert "spec.active" not in message, message


def test_a_finished_workload_under_a_running_job_says_what_happens_next() -> None:
    finished = workload(*ADMITTED_WL, ("Finished", "True", "Succeeded"))
    own = stored(kueue(body(SUSPENDED, scheduling=QUEUE), wl=finished))
    copy = stored(kueue(worker_copy(SUSPENDED), wl=finished))
    assert own["reason"] == copy["reason"] == "WorkloadFinished"
    assert own["message"].endswith("Delete the Workload to queue it again"), own["message"]
    assert copy["message"].endswith("MultiKueue deletes this copy"), copy["message"]
