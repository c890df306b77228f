"""GPUs counted from a worker's ResourceClaimTemplates (claims.py), and what decide
does with the count: the slots check, the ranks' environment, named stops."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from horovod_operator import claims
from horovod_operator.applying import dropped_fields
from horovod_operator.claims import TemplateRef, WorkerClaims
from horovod_operator.decide import decide
from horovod_operator.kube_errors import KubeError
from horovod_operator.observing import Observer

from .test_decide import NO_GANG, body, cond, created, observe, stored


def rct(*requests: dict[str, Any]) -> dict[str, Any]:
    return {"spec": {"spec": {"devices": {"requests": list(requests)}}}}


def exactly(name: str, device_class: str = "gpu.nvidia.com", **more: Any) -> dict[str, Any]:
    return {"name": name, "exactly": {"deviceClassName": device_class, **more}}


def claim_template(*claims_: tuple[str, str]) -> dict[str, Any]:
    """A worker template whose pod makes one claim per (name, template)."""
    return {
        "spec": {
            "resourceClaims": [
                {"name": name, "resourceClaimTemplateName": template} for name, template in claims_
            ]
        }
    }


def test_the_templates_a_worker_names_are_found_and_shared_claims_are_not() -> None:
    template = {
        "spec": {
            "resourceClaims": [
                {"name": "gpus", "resourceClaimTemplateName": "four-gpus"},
                {"name": "domain", "resourceClaimName": "one-for-all"},
            ]
        }
    }
    assert claims.template_refs(template) == [TemplateRef(0, "gpus", "four-gpus")]
    assert claims.template_refs(None) == []
    assert claims.template_refs({"spec": {}}) == []


@pytest.mark.parametrize(
    ("requests", "gpus"),
    [
        ([exactly("g", count=4)], 4),
        ([exactly("g")], 1),  # count defaults to one
        ([exactly("g", allocationMode="ExactCount", count=2), exactly("m", "mig.nvidia.com")], 3),
        # A NIC beside the GPUs is not a rank's GPU.
        ([exactly("g", count=2), exactly("nic", "rdma.example.com", count=2)], 2),
        # Alternatives of one size: whichever the scheduler picks.
        (
            [
                {
                    "name": "g",
                    "firstAvailable": [
                        {"name": "h200", "deviceClassName": "gpu.nvidia.com", "count": 2},
                        {"name": "h100", "deviceClassName": "gpu.nvidia.com", "count": 2},
                    ],
                }
            ],
            2,
        ),
    ],
)
def test_gpus_are_counted_from_gpu_classes_only(requests: list[dict[str, Any]], gpus: int) -> None:
    refs = [TemplateRef(0, "gpus", "t")]
    assert claims.count(refs, {"t": rct(*requests)}, "ns") == WorkerClaims(gpus=gpus)


def test_two_templates_add_up() -> None:
    refs = [TemplateRef(0, "a", "t1"), TemplateRef(1, "b", "t2")]
    found = {"t1": rct(exactly("g", count=2)), "t2": rct(exactly("g", count=1))}
    assert claims.count(refs, found, "ns").gpus == 3


def test_a_missing_template_is_named_with_its_field_and_namespace() -> None:
    result = claims.count([TemplateRef(1, "gpus", "four-gpus")], {"four-gpus": None}, "team-a")
    assert result.problem is not None
    reason, message = result.problem
    assert reason == "ClaimTemplateNotFound"
    assert "spec.worker.template.spec.resourceClaims[1] (gpus)" in message
    assert "ResourceClaimTemplate four-gpus" in message and "namespace team-a" in message


@pytest.mark.parametrize(
    ("request_", "words"),
    [
        (exactly("g", allocationMode="All"), "allocationMode All"),
        (
            {
                "name": "g",
                "firstAvailable": [
                    {"name": "big", "deviceClassName": "gpu.nvidia.com", "count": 4},
                    {"name": "small", "deviceClassName": "gpu.nvidia.com", "count": 2},
                ],
            },
            "[2, 4] GPUs",
        ),
    ],
)
def test_a_count_known_only_after_allocation_is_named(request_: dict[str, Any], words: str) -> None:
    result = claims.count([TemplateRef(0, "gpus", "t")], {"t": rct(request_)}, "ns")
    assert result.problem is not None
    assert result.problem[0] == "ClaimNotCountable"
    assert words in result.problem[1] and "ResourceClaimTemplate t" in result.problem[1]


def test_all_of_a_class_that_is_no_gpu_is_not_a_problem() -> None:
    result = claims.count(
        [TemplateRef(0, "nic", "t")], {"t": rct(exactly("n", "rdma.x", allocationMode="All"))}, "ns"
    )
    assert result == WorkerClaims(gpus=0, uncounted=("rdma.x",))


def test_an_operators_own_gpu_classes_are_counted() -> None:
    refs = [TemplateRef(0, "gpus", "t")]
    found = {"t": rct(exactly("g", "gpu.example.com", count=2))}
    assert claims.count(refs, found, "ns").gpus == 0
    assert claims.count(refs, found, "ns", ("gpu.example.com",)).gpus == 2


def test_fewer_gpus_than_ranks_blocks_with_both_sources_named() -> None:
    problem = claims.blocking(4, 1, WorkerClaims(gpus=2))
    assert problem is not None and problem[0] == "TooFewGPUs"
    assert (
        "3 GPU(s) per worker (2 from the worker's ResourceClaimTemplates and 1 from " in problem[1]
    )
    assert claims.blocking(3, 1, WorkerClaims(gpus=2)) is None
    assert claims.blocking(8, None, WorkerClaims()) is None  # no claimed GPU: nothing to check


# --- decide ----------------------------------------------------------------------------------


def claimed_job(slots: int = 2, **spec: Any) -> dict[str, Any]:
    return body(
        slotsPerWorker=slots,
        worker={"replicas": 2, "template": claim_template(("gpus", "two-gpus"))},
        **NO_GANG,
        **spec,
    )


def env_of(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in pod["spec"]["containers"][0]["env"]}


def test_claimed_gpus_reach_the_ranks_environment() -> None:
    plan = decide(observe(claimed_job(), with_infra=False, worker_claims=WorkerClaims(gpus=2)))
    pods = [o for o in plan.creates if o["kind"] == "Pod"]
    assert len(pods) == 2
    assert all(env_of(p)["HVJOB_GPUS_PER_WORKER"] == "2" for p in pods)
    # The pod keeps the claim the template names (the scheduler allocates it).
    assert pods[0]["spec"]["resourceClaims"] == [
        {"name": "gpus", "resourceClaimTemplateName": "two-gpus"}
    ]
    assert plan.events == []


def test_a_missing_template_stalls_the_job_before_any_worker() -> None:
    problem = ("ClaimTemplateNotFound", "spec.worker.template... names ResourceClaimTemplate x")
    seen = observe(claimed_job(), with_infra=False, worker_claims=WorkerClaims(problem=problem))
    plan = decide(seen)
    assert not [c for c in created(plan) if c.startswith("Pod/")]
    assert cond(plan, "Stalled")[:2] == ("True", "ClaimTemplateNotFound")
    assert stored(plan)["reason"] == "ClaimTemplateNotFound"
    assert [(e.type, e.reason) for e in plan.events] == [("Warning", "ClaimTemplateNotFound")]
    assert plan.requeue_after == 10.0  # templates are not watched: looked for again
    # Once it exists, the workers come.
    later = decide(observe(claimed_job(status=stored(plan)), worker_claims=WorkerClaims(gpus=2)))
    assert "Pod/j-worker-0" in created(later)


def test_more_ranks_than_claimed_gpus_stalls_naming_the_fix() -> None:
    seen = observe(claimed_job(slots=4), with_infra=False, worker_claims=WorkerClaims(gpus=2))
    plan = decide(seen)
    assert not [c for c in created(plan) if c.startswith("Pod/")]
    status, reason, message = cond(plan, "Stalled")
    assert (status, reason) == ("True", "TooFewGPUs")
    assert "slotsPerWorker: 4 is more than the 2 GPU(s) per worker" in message


def test_claims_of_no_gpu_class_are_said_once_and_do_not_stop_the_job() -> None:
    seen = observe(
        claimed_job(slots=1), with_infra=False, worker_claims=WorkerClaims(uncounted=("rdma.x",))
    )
    plan = decide(seen)
    assert "Pod/j-worker-0" in created(plan)
    assert [(e.type, e.reason) for e in plan.events] == [("Warning", "ClaimsWithoutGPUs")]
    assert "rdma.x" in plan.events[0].message
    assert "HVJOB_GPUS_PER_WORKER" not in env_of(
        next(o for o in plan.creates if o["kind"] == "Pod")
    )


# --- claims the gang shares ---------------------------------------------------------------

SHARED = {"name": "domain", "resourceClaimTemplateName": "nvlink-domain"}


def gang_claims_job(policy: str = "Auto", **spec: Any) -> dict[str, Any]:
    return body(scheduling={"gang": {"policy": policy, "resourceClaims": [SHARED]}}, **spec)


def test_the_gangs_claims_go_on_its_pod_group_and_every_worker() -> None:
    plan = decide(observe(gang_claims_job(), with_infra=False, gang_api=True))
    (group,) = [o for o in plan.creates if o["kind"] == "PodGroup"]
    assert group["spec"]["resourceClaims"] == [SHARED]
    pods = [o for o in plan.creates if o["kind"] == "Pod"]
    assert len(pods) == 2
    for pod in pods:
        # Matched exactly: the pod uses the group's claim instead of making its own.
        assert pod["spec"]["resourceClaims"] == [SHARED]
        worker = next(c for c in pod["spec"]["containers"] if c["name"] == "worker")
        assert worker["resources"]["claims"] == [{"name": "domain"}]


def test_shared_claims_wait_for_the_native_gang_instead_of_one_claim_per_pod() -> None:
    plan = decide(observe(gang_claims_job(), with_infra=False, gang_api=False))
    assert not [c for c in created(plan) if c.startswith(("Pod/", "PodGroup/"))]
    status, reason, message = cond(plan, "Stalled")
    assert (status, reason) == ("True", "GangSchedulingUnavailable")
    assert "resourceClaims are shared through the native gang" in message
    assert not [e for e in plan.events if e.reason == "NoGangScheduler"]


@pytest.mark.parametrize(
    ("gang", "worker", "words"),
    [
        ({"policy": "Volcano", "resourceClaims": [SHARED]}, {}, "only the native gang"),
        (
            {"resourceClaims": [SHARED]},
            {"template": claim_template(("domain", "other"))},
            "'domain' is used twice",
        ),
        ({"resourceClaims": [{"name": "domain"}]}, {}, "exactly one of"),
    ],
)
def test_shared_claims_that_cannot_work_are_invalid(
    gang: dict[str, Any], worker: dict[str, Any], words: str
) -> None:
    plan = decide(observe(body(scheduling={"gang": gang}, worker=worker), with_infra=False))
    status, reason, message = cond(plan, "Failed")
    assert (status, reason) == ("True", "InvalidSpec")
    assert words in message


def test_a_pod_group_stored_without_its_claims_is_noticed() -> None:
    sent = {"kind": "PodGroup", "spec": {"resourceClaims": [SHARED]}}
    (dropped,) = dropped_fields(sent, {"kind": "PodGroup", "spec": {}})
    assert dropped[:2] == ("resourceClaims", "DRAWorkloadResourceClaims")
    assert dropped_fields(sent, sent) == []
    topology = {"kind": "PodGroup", "spec": {"schedulingConstraints": {"topology": [{"key": "r"}]}}}
    (dropped,) = dropped_fields(topology, {"kind": "PodGroup", "spec": {}})
    assert dropped[:2] == ("schedulingConstraints", "TopologyAwareWorkloadScheduling")
    assert dropped_fields({"kind": "PodGroup", "spec": {}}, {"kind": "PodGroup", "spec": {}}) == []


# --- the executor's read of the templates -------------------------------------------------


class TemplateServer:
    """Answers the executor's GETs of ResourceClaimTemplates: `answers` in turn (an
    object, None for 404, or an error to raise)."""

    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)
        self.gets = 0

    async def get(self, kind: str, namespace: str, name: str, api_version: str = "") -> Any:
        assert kind == "ResourceClaimTemplate"
        self.gets += 1
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


@pytest.mark.parametrize("code", [403, 429, 503])
def test_a_refused_template_read_is_named_and_read_again(code: int) -> None:
    server = TemplateServer(
        KubeError(code, "Refused", "resourceclaimtemplates is forbidden"),
        rct(exactly("g", count=2)),
    )
    ex = Observer(server)  # type: ignore[arg-type]
    job = claimed_job()
    first = asyncio.run(ex._worker_claims(("ns", "j"), job))
    assert first is not None and first.problem is not None
    reason, message = first.problem
    assert reason == "ClaimTemplateUnreadable"
    assert f"ResourceClaimTemplate two-gpus in namespace ns ({code})" in message
    assert "resourceclaimtemplates is forbidden" in message
    # Stalled before any worker, and looked at again.
    plan = decide(observe(job, with_infra=False, worker_claims=first))
    assert not [c for c in created(plan) if c.startswith("Pod/")]
    assert cond(plan, "Stalled")[:2] == ("True", "ClaimTemplateUnreadable")
    assert plan.requeue_after == 10.0
    # The next look reads it (a refusal is not cached).
    assert asyncio.run(ex._worker_claims(("ns", "j"), job)) == WorkerClaims(gpus=2)
    assert server.gets == 2


def test_a_running_job_of_fixed_size_reads_no_template() -> None:
    ex = Observer(TemplateServer())  # type: ignore[arg-type]
    running = claimed_job(status={"phase": "Running"})
    assert asyncio.run(ex._worker_claims(("ns", "j"), running)) is None
