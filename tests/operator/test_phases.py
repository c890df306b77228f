"""compute_status: the job's phase machine, across pod-phase combinations."""

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from horovod_operator.api import Failure, HorovodJob, HorovodJobStatus, parse_job, parse_status
from horovod_operator.attempt_failures import wrong_world_size
from horovod_operator.children import Children, sort_children, stale_children
from horovod_operator.conditions import set_condition
from horovod_operator.phases import compute_status, invalid_spec_status
from horovod_operator.plan import Observation
from horovod_operator.status_writing import progress_only, status_body

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
T0 = "2026-01-01T11:59:00Z"
NOW_S = "2026-01-01T12:00:00Z"


def make_job(
    status: dict[str, Any] | None = None, launch_mode: str = "mpi", **run_policy: Any
) -> HorovodJob:
    body: dict[str, Any] = {
        "metadata": {"name": "j", "namespace": "ns", "uid": "u", "generation": 2},
        "spec": {
            "image": "i",
            "command": ["c"],
            "launchMode": launch_mode,
            "worker": {"replicas": 2},
            "runPolicy": {"backoffLimit": 1, **run_policy},
        },
    }
    if status is not None:
        body["status"] = status
    return parse_job(body)


def pod(
    role: str,
    name: str,
    phase: str = "Running",
    ready: bool = True,
    attempt: int = 0,
    exit_code: int | None = None,
    reason: str | None = None,
    terminating: bool = False,
    node: str | None = None,
) -> dict[str, Any]:
    status: dict[str, Any] = {
        "phase": phase,
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
    }
    if exit_code is not None:
        status["containerStatuses"] = [
            {"name": role, "state": {"terminated": {"exitCode": exit_code, "reason": "Error"}}}
        ]
    if reason:
        status["reason"] = reason
    owner = "u" if role == "worker" else f"launcher-{attempt}"
    metadata: dict[str, Any] = {
        "name": name,
        "labels": {"horovod.ai/role": role, "horovod.ai/attempt": str(attempt)},
        "creationTimestamp": "2026-01-01T11:59:30Z",
        "ownerReferences": [{"kind": "Pod", "uid": owner, "controller": True}],
    }
    if terminating:
        metadata["deletionTimestamp"] = NOW_S
    spec: dict[str, Any] = {"containers": [{"name": role}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": metadata, "spec": spec, "status": status}


def worker(i: int, phase: str = "Running", **kw: Any) -> dict[str, Any]:
    return pod("worker", f"j-worker-{i}", phase, **kw)


def launcher_pod(phase: str = "Running", **kw: Any) -> dict[str, Any]:
    return pod("launcher", "j-launcher-abcde", phase, **kw)


def launcher_job(condition: str | None = None, attempt: int = 0) -> dict[str, Any]:
    conditions = [{"type": condition, "status": "True"}] if condition else []
    return {
        "metadata": {
            "name": "j-launcher",
            "uid": f"launcher-{attempt}",
            "labels": {"horovod.ai/role": "launcher", "horovod.ai/attempt": str(attempt)},
            "ownerReferences": [{"kind": "HorovodJob", "uid": "u", "controller": True}],
        },
        "status": {"conditions": conditions},
    }


SECRET = {
    "kind": "Secret",
    "metadata": {"name": "j-ssh", "ownerReferences": [{"uid": "u", "controller": True}]},
}


def kids(
    pods: list[dict[str, Any]], ljob: dict[str, Any] | None = None, secret: bool = True
) -> Children:
    return sort_children(
        "u", {"Pod": pods, "Job": [ljob] if ljob else [], "Secret": [SECRET] if secret else []}
    )


def compute(job: HorovodJob, children: Children, now: datetime) -> HorovodJobStatus:
    seen = Observation(body={"metadata": {"name": job.metadata.name}}, children=children, now=now)
    return compute_status(job, seen).status


def status_of(
    job: HorovodJob, pods: list[dict[str, Any]], ljob: dict[str, Any] | None, now: datetime
) -> HorovodJobStatus:
    return compute(job, kids(pods, ljob), now)


RUNNING = {"phase": "Running", "startTime": T0, "workers": {"replicas": 2}}


@pytest.mark.parametrize(
    ("case", "status", "pods", "ljob", "phase", "counts"),
    [
        ("nothing yet", None, [], None, "Pending", (0, 0, 0)),
        ("one pending", None, [worker(0, "Pending", ready=False)], None, "Pending", (0, 0, 0)),
        (
            "running not ready",
            None,
            [worker(0, ready=False), worker(1, ready=False)],
            None,
            "Starting",
            (0, 2, 0),
        ),
        ("all ready, no launcher", None, [worker(0), worker(1)], None, "Starting", (2, 2, 0)),
        (
            "launcher pending",
            None,
            [worker(0), worker(1), launcher_pod("Pending")],
            launcher_job(),
            "Starting",
            (2, 2, 0),
        ),
        (
            "launcher running",
            None,
            [worker(0), worker(1), launcher_pod()],
            launcher_job(),
            "Running",
            (2, 2, 0),
        ),
        (
            "launcher succeeded",
            RUNNING,
            [worker(0), worker(1), launcher_pod("Succeeded", exit_code=0)],
            launcher_job("Complete"),
            "Succeeded",
            (2, 2, 0),
        ),
        (
            "worker OOM restarts",
            RUNNING,
            [worker(0), worker(1, "Failed", exit_code=137, reason="OOMKilled"), launcher_pod()],
            launcher_job(),
            "Restarting",
            (1, 1, 1),
        ),
        (
            "launcher failed restarts",
            RUNNING,
            [worker(0), worker(1), launcher_pod("Failed", exit_code=1)],
            launcher_job("Failed"),
            "Restarting",
            (2, 2, 0),
        ),
        (
            "old attempt pods are ignored",
            {**RUNNING, "phase": "Pending", "restarts": 1},
            [worker(0, "Failed", attempt=0, exit_code=1)],
            None,
            "Pending",
            (0, 0, 0),
        ),
        (
            "terminating pods are not counted",
            None,
            [worker(0, terminating=True), worker(1)],
            None,
            "Pending",
            (1, 1, 0),
        ),
    ],
)
def test_phases(
    case: str,
    status: dict[str, Any] | None,
    pods: list[dict[str, Any]],
    ljob: dict[str, Any] | None,
    phase: str,
    counts: tuple[int, int, int],
) -> None:
    result = status_of(make_job(status), pods, ljob, NOW)
    assert result.phase == phase, case
    assert result.workers is not None
    assert (result.workers.ready, result.workers.running, result.workers.failed) == counts
    assert result.observed_generation == 2
    assert result.start_time is not None


def test_worker_failure_names_the_pod_and_counts_the_restart() -> None:
    pods = [worker(0), worker(1, "Failed", exit_code=137, reason="OOMKilled"), launcher_pod()]
    result = status_of(make_job(RUNNING), pods, launcher_job(), NOW)
    assert result.restarts == 1
    assert result.failures == [
        Failure(pod="j-worker-1", container="worker", exit_code=137, reason="OOMKilled")
    ]
    restarting = next(c for c in result.conditions if c.type == "Restarting")
    assert restarting.reason == "WorkerFailed"
    assert "pod j-worker-1 container worker failed (OOMKilled, exit code 137)" in (
        restarting.message
    )
    assert "restart 1 of 1" in restarting.message


def test_backoff_limit_spent_fails_naming_the_cause() -> None:
    pods = [worker(0, attempt=1), worker(1, "Failed", attempt=1, exit_code=137)]
    status = {**RUNNING, "restarts": 1}
    result = status_of(make_job(status), pods, None, NOW)
    assert result.phase == "Failed"
    assert result.restarts == 1
    assert result.completion_time == NOW_S
    failed = next(c for c in result.conditions if c.type == "Failed")
    assert (failed.status, failed.reason) == ("True", "WorkerFailed")
    assert "j-worker-1" in failed.message
    assert "backoffLimit (1) reached" in failed.message
    assert result.failures[0].exit_code == 137


def test_evicted_worker_restarts_without_counting() -> None:
    pods = [worker(0), worker(1, "Failed", reason="Evicted")]
    result = status_of(make_job(RUNNING, backoffLimit=0), pods, None, NOW)
    assert result.phase == "Restarting"
    assert (result.restarts, result.uncounted_restarts) == (1, 1)
    assert result.failures == [
        Failure(pod="j-worker-1", container="worker", exit_code=None, reason="Evicted")
    ]
    restarting = next(c for c in result.conditions if c.type == "Restarting")
    assert "a disruption (Evicted) is not counted: restart 1, not counted" in restarting.message


def test_an_evicted_launcher_whose_pod_is_gone_restarts_without_counting() -> None:
    """Evicted: the launcher Job (backoffLimit 0) says Failed once its pod is deleted;
    the executor kept the pod's DisruptionTarget (Children.launcher_disruptions)."""
    running = {**RUNNING, "launcher": {"phase": "Running", "podName": "j-launcher-abcde"}}
    children = kids([worker(0), worker(1)], launcher_job("Failed"))
    lost = compute(make_job(running, backoffLimit=0), children, NOW)
    assert lost.phase == "Failed"  # nothing said why: a failure, as before
    children.launcher_disruptions = {"j-launcher-abcde": "EvictionByEvictionAPI"}
    result = compute(make_job(running, backoffLimit=0), children, NOW)
    assert result.phase == "Restarting"
    assert (result.restarts, result.uncounted_restarts) == (1, 1)
    assert result.failures[0].pod == "j-launcher-abcde"


def test_launcher_failure_reports_its_exit_code() -> None:
    pods = [worker(0), worker(1), launcher_pod("Failed", exit_code=3)]
    result = status_of(make_job(RUNNING, backoffLimit=0), pods, launcher_job("Failed"), NOW)
    assert result.phase == "Failed"
    assert result.failures == [
        Failure(pod="j-launcher-abcde", container="launcher", exit_code=3, reason="Error")
    ]
    assert result.launcher is not None
    assert (result.launcher.phase, result.launcher.exit_code) == ("Failed", 3)


def test_failures_keep_the_launchers_last_log_lines() -> None:
    failed = launcher_pod("Failed", exit_code=3)
    terminated = failed["status"]["containerStatuses"][0]["state"]["terminated"]
    terminated["message"] = "x" * 5000 + "\nepoch 2 loss 0.3\nboom: exit 3\n"
    pods = [worker(0), worker(1), failed]
    result = status_of(make_job(RUNNING, backoffLimit=0), pods, launcher_job("Failed"), NOW)
    (failure,) = result.failures
    assert failure.message is not None
    assert failure.message.endswith("epoch 2 loss 0.3\nboom: exit 3\n")
    assert len(failure.message) == 2048


def test_restarting_waits_for_old_children() -> None:
    status = {**RUNNING, "phase": "Restarting", "restarts": 1}
    old = [worker(0, attempt=0), worker(1, attempt=0, terminating=True)]
    assert status_of(make_job(status), old, launcher_job(attempt=0), NOW).phase == ("Restarting")
    assert stale_children(kids(old, launcher_job(attempt=0)), 1) == [
        "j-worker-0",
        "j-worker-1",
        "j-launcher",
    ]
    result = status_of(make_job(status), [], None, NOW)
    assert result.phase == "Pending"
    restarting = next(c for c in result.conditions if c.type == "Restarting")
    assert restarting.status == "False"


def test_terminal_status_is_final() -> None:
    status = {"phase": "Succeeded", "completionTime": T0, "observedGeneration": 1}
    result = status_of(make_job(status), [worker(0, "Failed", exit_code=1)], None, NOW)
    stored = parse_status(status)
    assert stored is not None
    assert status_body(result) == status_body(stored)


def test_deadline_exceeded() -> None:
    job = make_job(RUNNING, activeDeadlineSeconds=60)
    result = status_of(job, [worker(0), worker(1)], None, NOW)
    assert result.phase == "Failed"
    assert next(c for c in result.conditions if c.type == "Failed").reason == "DeadlineExceeded"
    early = make_job(RUNNING, activeDeadlineSeconds=61)
    assert status_of(early, [worker(0), worker(1)], None, NOW).phase == "Starting"


def test_suspend_and_resume() -> None:
    suspended = status_of(make_job(RUNNING, suspend=True), [worker(0)], None, NOW)
    assert suspended.phase == "Suspended"
    assert [c.type for c in suspended.conditions if c.status == "True"] == ["Suspended"]
    later = NOW + timedelta(minutes=5)
    resumed = status_of(make_job(status_body(suspended)), [], None, later)
    assert resumed.phase == "Pending"
    assert resumed.start_time == "2026-01-01T12:05:00Z"  # the deadline counts from here
    condition = next(c for c in resumed.conditions if c.type == "Suspended")
    assert (condition.status, condition.reason) == ("False", "JobResumed")


def test_replicas_change_on_running_job_is_rejected() -> None:
    job = make_job({**RUNNING, "workers": {"replicas": 3}})
    result = status_of(job, [], None, NOW)
    assert result.workers is not None
    assert result.workers.replicas == 3
    rejected = next(c for c in result.conditions if c.type == "SpecRejected")
    assert rejected.reason == "ReplicasImmutable"
    assert "worker.replicas cannot change on a started job (3 -> 2)" in rejected.message


def test_unchanged_inputs_give_an_identical_status() -> None:
    pods = [worker(0), worker(1), launcher_pod()]
    first = status_of(make_job(), pods, launcher_job(), NOW)
    second = status_of(make_job(status_body(first)), pods, launcher_job(), NOW + timedelta(hours=1))
    assert status_body(second) == status_body(first)


def test_condition_transition_time_moves_only_on_status_change() -> None:
    conditions = set_condition([], "Running", True, "A", "m", NOW)
    later = NOW + timedelta(minutes=1)
    same = set_condition(conditions, "Running", True, "B", "other", later)
    assert same[0].last_transition_time == NOW_S
    assert same[0].reason == "B"
    flipped = set_condition(same, "Running", False, "C", "", later)
    assert flipped[0].last_transition_time == "2026-01-01T12:01:00Z"


def test_invalid_spec_status() -> None:
    result = invalid_spec_status(None, "spec.x: bad", 3, NOW)
    assert status_body(result) == {
        "phase": "Failed",
        "reason": "InvalidSpec",
        "message": "spec.x: bad",
        "conditions": [
            {
                "type": "Failed",
                "status": "True",
                "reason": "InvalidSpec",
                "message": "spec.x: bad",
                "lastTransitionTime": NOW_S,
            }
        ],
        "failures": [],
        "restarts": 0,
        "uncountedRestarts": 0,
        "completionTime": NOW_S,
        "observedGeneration": 3,
    }
    # The stored body reads back as the same status.
    assert HorovodJobStatus.model_validate(status_body(result)) == result


def test_progress_only_tells_a_start_getting_on_from_a_change_users_wait_for() -> None:
    # The statuses a 2-worker job passes through, each computed from the one stored.
    steps = [
        ("workers created", [worker(0, "Pending", ready=False), worker(1, "Pending", ready=False)]),
        ("one running", [worker(0, ready=False), worker(1, "Pending", ready=False)]),
        ("all running", [worker(0, ready=False), worker(1, ready=False)]),
        ("all ready", [worker(0), worker(1)]),
        ("launcher pending", [worker(0), worker(1), launcher_pod("Pending")]),
        ("launcher running", [worker(0), worker(1), launcher_pod()]),
        ("worker failed", [worker(0), worker(1, "Failed", exit_code=1), launcher_pod()]),
    ]
    stored: dict[str, Any] = {}
    seen: dict[str, bool] = {}
    for case, pods in steps:
        ljob = launcher_job() if any("launcher" in p["metadata"]["name"] for p in pods) else None
        new = status_body(status_of(make_job(stored or None), pods, ljob, NOW))
        assert new != stored, case
        seen[case] = progress_only(stored, new)
        stored = new
    assert seen == {
        "workers created": False,  # the first status is never held back
        "one running": True,
        "all running": True,  # Pending -> Starting
        "all ready": True,
        "launcher pending": True,
        "launcher running": False,  # Running
        "worker failed": False,  # Restarting, with the failure
    }


def test_progress_only_holds_back_no_condition_but_created() -> None:
    base = status_body(status_of(make_job(), [worker(0), worker(1)], None, NOW))
    assert base["phase"] == "Starting"
    created = [c for c in base["conditions"] if c["type"] == "Created"]
    assert created, base
    without_created = {**base, "conditions": [c for c in base["conditions"] if c not in created]}
    assert progress_only(without_created, base)
    other = {"type": "Suspended", "status": "False", "reason": "Resumed", "message": "m"}
    assert not progress_only(base, {**base, "conditions": [*base["conditions"], other]})
    assert not progress_only(base, {**base, "restarts": 1})
    assert not progress_only(base, {**base, "phase": "Suspended"})
    assert not progress_only({**base, "phase": "Restarting"}, {**base, "phase": "Pending"})


# --- launchMode: gloo: the worker pods are the result --------------------------------------


@pytest.mark.parametrize(
    ("case", "pods", "ljob", "phase"),
    [
        (
            "every worker succeeded",
            [worker(0, "Succeeded"), worker(1, "Succeeded"), launcher_pod("Succeeded")],
            launcher_job("Complete"),
            "Succeeded",
        ),
        (
            # A worker's report to the launcher is best effort: the pods decide.
            "workers succeeded, the launcher still waits",
            [worker(0, "Succeeded"), worker(1, "Succeeded"), launcher_pod()],
            launcher_job(),
            "Succeeded",
        ),
        (
            "one worker still running",
            [worker(0, "Succeeded"), worker(1), launcher_pod()],
            launcher_job(),
            "Running",
        ),
        (
            # The launcher ends once every worker reported; their pods may lag.
            "the launcher ended before the pods",
            [worker(0), worker(1), launcher_pod("Succeeded")],
            launcher_job("Complete"),
            "Running",
        ),
    ],
)
def test_gloo_success_is_every_worker_pod_succeeding(
    case: str, pods: list[dict[str, Any]], ljob: dict[str, Any], phase: str
) -> None:
    result = status_of(make_job(RUNNING, launch_mode="gloo"), pods, ljob, NOW)
    assert result.phase == phase, case
    if phase == "Succeeded":
        succeeded = next(c for c in result.conditions if c.type == "Succeeded")
        assert succeeded.message == "every worker pod (2) completed successfully"


def test_gloo_failed_rank_names_its_worker_pod_and_exit_code() -> None:
    pods = [worker(0), worker(1, "Failed", exit_code=3), launcher_pod("Succeeded")]
    result = status_of(
        make_job(RUNNING, launch_mode="gloo", backoffLimit=0), pods, launcher_job("Complete"), NOW
    )
    assert result.phase == "Failed"
    assert result.failures == [
        Failure(pod="j-worker-1", container="worker", exit_code=3, reason="Error")
    ]


def test_two_thousand_failed_ranks_fit_a_small_status_and_the_first_is_kept() -> None:
    """etcd refuses objects over 1.5 MiB: 700 ranks failing with a 2 KiB log tail each
    passed it, the write failed, and the job stayed Running for ever."""
    replicas = 2048
    job = make_job({**RUNNING, "workers": {"replicas": replicas}}, launch_mode="gloo")
    job.spec.worker.replicas = replicas
    pods = []
    for i in range(replicas):
        failed = worker(i, "Failed", exit_code=1)
        terminated = failed["status"]["containerStatuses"][0]["state"]["terminated"]
        terminated["message"] = f"rank {i}: " + "x" * 3000
        # Rank 1234 failed first; the others a second later (they lost a peer).
        terminated["finishedAt"] = "2026-01-01T11:59:40Z" if i == 1234 else "2026-01-01T11:59:41Z"
        pods.append(failed)
    result = compute(job, kids(pods), NOW)
    assert result.phase == "Restarting"
    assert len(result.failures) == 10
    assert result.failures[0].pod == "j-worker-1234"
    assert "and 2045 more (2048 failures in all)" in (result.message or "")
    size = len(json.dumps(status_body(result)))
    assert size < 64 * 1024, size


def test_a_secret_deleted_while_the_attempt_runs_restarts_it_uncounted() -> None:
    pods = [worker(0, node="n"), worker(1, node="n"), launcher_pod(node="n")]
    running = make_job(RUNNING, backoffLimit=0)
    result = compute(running, kids(pods, launcher_job(), secret=False), NOW)
    assert result.phase == "Restarting"
    assert (result.restarts, result.uncounted_restarts) == (1, 1)
    assert result.failures[0].pod == "j-ssh" and result.failures[0].reason == "SecretDeleted"
    # With its Secret, or in gloo mode (no ssh), or before the attempt started: nothing.
    assert compute(running, kids(pods, launcher_job()), NOW).phase == "Running"
    gloo = make_job(RUNNING, launch_mode="gloo", backoffLimit=0)
    assert compute(gloo, kids(pods, launcher_job(), secret=False), NOW).phase == "Running"
    # Workers that all wait for a node mount whichever Secret there is when they start.
    pending = make_job({**RUNNING, "phase": "Pending"}, backoffLimit=0)
    waiting = [worker(0, "Pending", ready=False), worker(1, "Pending", ready=False)]
    assert compute(pending, kids(waiting, None, secret=False), NOW).phase == "Pending"
    # One already bound may hold the old key while the other waits: start over.
    waiting[0] = worker(0, "Running", node="n")
    result = compute(pending, kids(waiting, None, secret=False), NOW)
    assert result.phase == "Restarting" and result.uncounted_restarts == 1, result


HUNG = {
    "time": NOW_S,
    "message": "no new step for 75s (progressDeadlineSeconds 60) after step 40: Horovod's "
    "stall inspector names rank 1 (j-worker-1) as not submitting the tensors",
    "ranks": [1],
    "pods": ["j-worker-1"],
}


def _running_with(progress: dict[str, Any], **run_policy: Any) -> HorovodJobStatus:
    job = make_job({**RUNNING, "progress": progress}, progressDeadlineSeconds=60, **run_policy)
    pods = [worker(0), worker(1), launcher_pod()]
    return status_of(job, pods, launcher_job(), NOW)


def test_a_hung_attempt_restarts_counted_naming_the_silent_rank() -> None:
    result = _running_with({"attempt": 0, "step": 40, "worldSize": 2, "hung": HUNG})
    assert result.phase == "Restarting" and result.restarts == 1
    restarting = next(c for c in result.conditions if c.type == "Restarting")
    assert restarting.reason == "Hung"
    assert "rank 1 (j-worker-1)" in restarting.message and "restart 1 of 1" in restarting.message
    assert [(f.pod, f.reason) for f in result.failures] == [("j-worker-1", "Hung")]


def test_a_hung_attempt_fails_the_job_when_the_action_says_so() -> None:
    progress = {"attempt": 0, "step": 40, "hung": HUNG}
    result = _running_with(progress, progressDeadlineAction="FailJob")
    assert result.phase == "Failed" and result.reason == "PodFailurePolicy"
    assert "runPolicy.progressDeadlineAction (FailJob)" in (result.message or "")
    ignored = _running_with(progress, progressDeadlineAction="Ignore")
    assert (ignored.phase, ignored.restarts, ignored.uncounted_restarts) == ("Restarting", 1, 1)


def test_the_progress_of_an_earlier_attempt_is_not_this_ones() -> None:
    job = make_job({**RUNNING, "restarts": 1, "progress": {"attempt": 0, "hung": HUNG}})
    pods = [worker(0, attempt=1), worker(1, attempt=1), launcher_pod(attempt=1)]
    assert status_of(job, pods, launcher_job(attempt=1), NOW).phase == "Running"


def test_two_worlds_of_one_rank_fail_the_job_with_both_numbers() -> None:
    result = _running_with({"attempt": 0, "step": 3, "worldSize": 1})
    assert (result.phase, result.reason) == ("Failed", "WrongWorldSize")
    assert "world of 1 but the job runs 2 (worker.replicas 2 x slotsPerWorker 1)" in (
        result.message or ""
    )
    assert "did not join one Horovod world" in (result.message or "")
    assert _running_with({"attempt": 0, "step": 3, "worldSize": 2}).phase == "Running"


def test_an_elastic_world_may_be_anywhere_between_its_bounds() -> None:
    body: dict[str, Any] = {
        "metadata": {"name": "j", "namespace": "ns", "uid": "u"},
        "spec": {
            "image": "i",
            "command": ["c"],
            "launchMode": "gloo",
            "slotsPerWorker": 2,
            "worker": {"replicas": 3},
            "elastic": {"minReplicas": 2, "maxReplicas": 4},
        },
    }
    job = parse_job(body)
    assert wrong_world_size(job, 4) is None and wrong_world_size(job, 8) is None
    assert "4 to 8" in (wrong_world_size(job, 2) or "")
    assert "4 to 8" in (wrong_world_size(job, 10) or "")


def test_compute_status_says_what_a_start_waits_for_and_fails_it_past_its_timeout() -> None:
    """Every way to fail is compute_status's: the startup timeout too, naming what
    the attempt waited for (waiting.report)."""
    stuck = worker(1, "Pending", ready=False)
    stuck["status"]["conditions"].append(
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "no GPU"}
    )
    pending = {"phase": "Pending", "startTime": T0, "workers": {"replicas": 2}}
    within = compute(make_job(pending, startupTimeoutSeconds=600), kids([worker(0), stuck]), NOW)
    assert (within.phase, within.reason) == ("Pending", "Unschedulable")
    assert within.message == "pod j-worker-1: no GPU"
    late = NOW + timedelta(seconds=600)
    past = compute(make_job(pending, startupTimeoutSeconds=600), kids([worker(0), stuck]), late)
    assert (past.phase, past.reason) == ("Failed", "StartupTimeout")
    assert past.message == (
        "the attempt did not start within startupTimeoutSeconds (600s): pod j-worker-1: no GPU"
    )
