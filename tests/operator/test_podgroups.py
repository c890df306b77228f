"""Volcano's and scheduler-plugins' coscheduling PodGroups (gang.policy Volcano |
Coscheduling): the objects compared whole, the pods' link to them, and what
decide does with and without their CRD served."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from horovod_operator import builders, podgroups
from horovod_operator.api import HorovodJob, parse_job
from horovod_operator.decide import decide
from horovod_operator.plan import Refusal
from tests.operator.test_decide import RUNNING, body, cond, created, observe, stored

OWNER = {
    "apiVersion": "horovod.ai/v1alpha1",
    "kind": "HorovodJob",
    "name": "mnist",
    "uid": "uid-1",
    "controller": True,
    "blockOwnerDeletion": True,
}
GROUP_LABELS = {
    "horovod.ai/job-name": "mnist",
    "app.kubernetes.io/managed-by": "horovod-operator",
    "horovod.ai/role": "worker",
    "horovod.ai/attempt": "1",
}


def make_job(policy: str, **scheduling: Any) -> HorovodJob:
    """3 workers of 2 GPUs, 4 CPUs (requests below limits) and 16Gi; a sidecar-free
    template with an init container larger than nothing the gang would double count."""
    spec: dict[str, Any] = {
        "image": "horovod-worker:0.1.0",
        "command": ["python", "train.py"],
        "slotsPerWorker": 2,
        "worker": {
            "replicas": 3,
            "resources": {
                "limits": {"nvidia.com/gpu": 2, "cpu": "8", "memory": "16Gi"},
                "requests": {"cpu": "4"},
            },
        },
        "runPolicy": {"startupTimeoutSeconds": 600},
        "scheduling": {"gang": {"policy": policy}, **scheduling},
    }
    return parse_job(
        {"metadata": {"name": "mnist", "namespace": "team", "uid": "uid-1"}, "spec": spec}
    )


GANG_RESOURCES = {"cpu": "12", "memory": str(3 * 16 * 2**30), "nvidia.com/gpu": "6"}


def test_a_volcano_group_holds_the_gang_its_resources_queue_and_priority() -> None:
    job = make_job("Volcano", queue="research", priorityClassName="high")
    assert builders.new_pod_group(job, 1) == {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "PodGroup",
        "metadata": {
            "name": "mnist-gang-1-3",
            "namespace": "team",
            "labels": GROUP_LABELS,
            "ownerReferences": [OWNER],
        },
        "spec": {
            "minMember": 3,
            "minResources": GANG_RESOURCES,
            "queue": "research",
            "priorityClassName": "high",
        },
    }


def test_a_coscheduling_group_holds_the_gang_its_resources_and_the_schedule_timeout() -> None:
    job = make_job("Coscheduling", gang={"policy": "Coscheduling", "minAvailable": 2})
    assert builders.new_pod_group(job, 1) == {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {
            "name": "mnist-gang-1-2",
            "namespace": "team",
            "labels": GROUP_LABELS,
            "ownerReferences": [OWNER],
        },
        "spec": {
            # minAvailable 2 of 3: the resources of the 2 that must fit at once.
            "minMember": 2,
            "minResources": {"cpu": "8", "memory": str(2 * 16 * 2**30), "nvidia.com/gpu": "4"},
            "scheduleTimeoutSeconds": 600,
        },
    }


def test_without_a_startup_timeout_or_queue_the_fields_are_left_to_the_scheduler() -> None:
    cosched = make_job("Coscheduling")
    cosched.spec.run_policy.startup_timeout_seconds = None
    assert "scheduleTimeoutSeconds" not in builders.new_pod_group(cosched, 0)["spec"]
    volcano = builders.new_pod_group(make_job("Volcano"), 0)["spec"]
    assert set(volcano) == {"minMember", "minResources"}  # Volcano's default queue


def test_volcano_workers_carry_the_group_annotation_and_the_volcano_scheduler() -> None:
    job = make_job("Volcano", queue="research")
    pod = builders.new_worker_pod(job, 0, 1, gang=True)
    assert pod["metadata"]["annotations"] == {"scheduling.k8s.io/group-name": "mnist-gang-1-3"}
    assert pod["spec"]["schedulerName"] == "volcano"
    assert "schedulingGroup" not in pod["spec"]
    # The queue is Volcano's: no Kueue label, and Kueue does not admit the job.
    assert "kueue.x-k8s.io/queue-name" not in pod["metadata"]["labels"]
    launcher = builders.new_launcher_job(job, 1)["spec"]["template"]
    assert "kueue.x-k8s.io/queue-name" not in launcher["metadata"]["labels"]


def test_coscheduling_workers_carry_the_group_label_and_the_plugins_scheduler() -> None:
    job = make_job("Coscheduling")
    pod = builders.new_worker_pod(job, 2, 0, gang=True)
    assert pod["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] == "mnist-gang-0-3"
    assert pod["spec"]["schedulerName"] == "scheduler-plugins-scheduler"
    assert "schedulingGroup" not in pod["spec"]


def test_the_users_scheduler_name_and_annotations_win_over_the_default() -> None:
    job = make_job("Coscheduling", schedulerName="sched-gang")
    job.spec.worker.template = {"metadata": {"annotations": {"team": "a"}}}
    pod = builders.new_worker_pod(job, 0, 0, gang=True)
    assert pod["spec"]["schedulerName"] == "sched-gang"
    volcano = make_job("Volcano", schedulerName="vc2")
    volcano.spec.worker.template = {"metadata": {"annotations": {"team": "a"}}}
    pod = builders.new_worker_pod(volcano, 0, 0, gang=True)
    assert pod["spec"]["schedulerName"] == "vc2"
    assert pod["metadata"]["annotations"] == {
        "team": "a",
        "scheduling.k8s.io/group-name": "mnist-gang-0-3",
    }


def test_the_launcher_is_not_in_the_group_and_keeps_the_default_scheduler() -> None:
    for policy in ("Volcano", "Coscheduling"):
        template = builders.new_launcher_job(make_job(policy), 0)["spec"]["template"]
        assert "schedulerName" not in template["spec"]
        assert "scheduling.x-k8s.io/pod-group" not in template["metadata"]["labels"]
        assert "scheduling.k8s.io/group-name" not in (template["metadata"].get("annotations") or {})


@pytest.mark.parametrize(
    ("pod_spec", "expected"),
    [
        # A request defaults to the limit; containers add up.
        (
            {
                "containers": [
                    {"resources": {"limits": {"cpu": "1", "memory": "1Gi"}}},
                    {"resources": {"requests": {"cpu": "250m"}}},
                ]
            },
            {"cpu": Decimal("1.25"), "memory": Decimal(2**30)},
        ),
        # An init container runs alone: the larger of it and the containers counts;
        # a sidecar (restartPolicy Always) runs beside them and adds up.
        (
            {
                "initContainers": [
                    {"resources": {"requests": {"cpu": "3", "memory": "1Mi"}}},
                    {"restartPolicy": "Always", "resources": {"requests": {"cpu": "500m"}}},
                ],
                "containers": [{"resources": {"requests": {"cpu": "2", "memory": "2Mi"}}}],
                "overhead": {"cpu": "100m"},
            },
            {"cpu": Decimal("3.1"), "memory": Decimal(2 * 2**20)},
        ),
        ({"containers": [{"name": "none"}]}, {}),
    ],
)
def test_a_pods_effective_requests(pod_spec: dict[str, Any], expected: dict[str, Decimal]) -> None:
    assert podgroups.pod_requests(pod_spec) == expected


@pytest.mark.parametrize(
    ("value", "text"),
    [("12", "12"), ("1.25", "1250m"), ("0.0001", "1m"), ("17179869184", "17179869184")],
)
def test_quantities_are_written_as_the_api_server_reads_them(value: str, text: str) -> None:
    assert podgroups.format_quantity(Decimal(value)) == text


def test_a_worker_template_with_cpu_only_gives_a_cpu_only_group() -> None:
    job = make_job("Volcano")
    job.spec.worker.resources = None
    job.spec.worker.template = {
        "spec": {"containers": [{"name": "worker", "resources": {"requests": {"cpu": "500m"}}}]}
    }
    assert builders.new_pod_group(job, 0)["spec"]["minResources"] == {"cpu": "1500m"}
    job.spec.worker.template = None
    assert "minResources" not in builders.new_pod_group(job, 0)["spec"]


# --- decide -------------------------------------------------------------------------------

SERVED: dict[str, str] = {"Volcano": "volcano_api", "Coscheduling": "coscheduling_api"}


def served(policy: str) -> dict[str, Any]:
    """The Observation flag saying the policy's CRD is served."""
    return {SERVED[policy]: True}


API_VERSION = {
    "Volcano": "scheduling.volcano.sh/v1beta1",
    "Coscheduling": "scheduling.x-k8s.io/v1alpha1",
}


@pytest.mark.parametrize("policy", ["Volcano", "Coscheduling"])
def test_the_group_is_created_before_the_workers(policy: str) -> None:
    job = body(scheduling={"gang": {"policy": policy}})
    plan = decide(observe(job, **served(policy)))
    assert created(plan) == ["PodGroup/j-gang-0-2", "Pod/j-worker-0", "Pod/j-worker-1"]
    assert plan.creates[0]["apiVersion"] == API_VERSION[policy]
    assert plan.creates[0]["spec"]["minMember"] == 2


@pytest.mark.parametrize("policy", ["Volcano", "Coscheduling"])
def test_a_restart_forms_a_new_group(policy: str) -> None:
    status = {**RUNNING, "phase": "Restarting", "restarts": 1, "launcher": None}
    plan = decide(
        observe(body(status, scheduling={"gang": {"policy": policy}}), [], **served(policy))
    )
    assert created(plan) == ["PodGroup/j-gang-1-2", "Pod/j-worker-0", "Pod/j-worker-1"]


@pytest.mark.parametrize(
    ("policy", "install"),
    [("Volcano", "install Volcano"), ("Coscheduling", "install scheduler-plugins")],
)
def test_without_the_crd_no_worker_is_created_and_the_job_says_what_to_install(
    policy: str, install: str
) -> None:
    # The native Workload API being served does not stand in for the one asked for.
    plan = decide(observe(body(scheduling={"gang": {"policy": policy}}), gang_api=True))
    assert created(plan) == []
    state, reason, message = cond(plan, "Stalled")
    assert (state, reason) == ("True", "GangSchedulingUnavailable")
    assert f"spec.scheduling.gang.policy is {policy}" in message
    assert API_VERSION[policy] in message and install in message
    assert stored(plan)["reason"] == "GangSchedulingUnavailable"


def test_a_volcano_queue_is_not_a_kueue_queue() -> None:
    job = body(scheduling={"gang": {"policy": "Volcano"}, "queue": "research"})
    plan = decide(observe(job, kueue_api=True, volcano_api=True))
    assert created(plan) == ["PodGroup/j-gang-0-2", "Pod/j-worker-0", "Pod/j-worker-1"]
    assert plan.creates[0]["spec"]["queue"] == "research"


def test_an_unknown_policy_names_the_field_and_the_choices() -> None:
    with pytest.raises(ValueError, match=r"policy[\s\S]*'Volcano', 'Coscheduling'"):
        make_job("Kube-batch")


def test_a_refused_group_fails_the_job_naming_the_field_and_the_webhooks_words() -> None:
    job = body(scheduling={"gang": {"policy": "Volcano"}, "queue": "nope"})
    words = (
        'admission webhook "validatepodgroup.volcano.sh" denied the request: queue nope not found'
    )
    refusal = Refusal("PodGroup", "j-gang-0-2", 400, words, 1, "worker")
    plan = decide(observe(job, volcano_api=True, refusals=[refusal]))
    status = stored(plan)
    assert (status["phase"], status["reason"]) == ("Failed", "InvalidSpec")
    assert status["message"].startswith(
        "spec.scheduling: the API server rejected the gang's PodGroup (400): admission webhook"
    )
    assert "queue nope not found" in status["message"]
