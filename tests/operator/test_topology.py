"""spec.scheduling.topology on the objects: the native gang's PodGroup constraint, or
a pod affinity to the attempt's other workers."""

from __future__ import annotations

from typing import Any

import pytest

from horovod_operator.decide import decide

from .test_decide import NO_GANG, body, cond, created, observe

RACK = "topology.kubernetes.io/rack"


def plan_for(mode: str, gang_api: bool, **spec: Any) -> Any:
    scheduling = {"topology": {"key": RACK, "mode": mode}, **spec.pop("scheduling", {})}
    return decide(observe(body(scheduling=scheduling, **spec), with_infra=False, gang_api=gang_api))


def workers(plan: Any) -> list[dict[str, Any]]:
    return [o for o in plan.creates if o["kind"] == "Pod"]


def test_required_with_the_native_gang_is_the_pod_groups_constraint() -> None:
    plan = plan_for("Required", gang_api=True)
    (group,) = [o for o in plan.creates if o["kind"] == "PodGroup"]
    assert group["spec"]["schedulingConstraints"] == {"topology": [{"key": RACK}]}
    # The scheduler picks the domain for the whole gang: no affinity on the pods.
    assert all("affinity" not in pod["spec"] for pod in workers(plan))


@pytest.mark.parametrize(
    ("mode", "gang_api", "spec", "key"),
    [
        ("Required", False, {}, "requiredDuringSchedulingIgnoredDuringExecution"),
        ("Required", True, NO_GANG, "requiredDuringSchedulingIgnoredDuringExecution"),
        ("Preferred", True, {}, "preferredDuringSchedulingIgnoredDuringExecution"),
        ("Preferred", False, {}, "preferredDuringSchedulingIgnoredDuringExecution"),
    ],
)
def test_elsewhere_it_is_an_affinity_to_the_attempts_other_workers(
    mode: str, gang_api: bool, spec: dict[str, Any], key: str
) -> None:
    plan = plan_for(mode, gang_api, **spec)
    for group in [o for o in plan.creates if o["kind"] == "PodGroup"]:
        assert "schedulingConstraints" not in group["spec"]
    pods = workers(plan)
    assert len(pods) == 2
    for pod in pods:
        (term,) = pod["spec"]["affinity"]["podAffinity"][key]
        term = term.get("podAffinityTerm", term)
        assert term["topologyKey"] == RACK
        labels = term["labelSelector"]["matchLabels"]
        # The attempt's own workers: an earlier attempt's pods pull nothing.
        assert labels["horovod.ai/attempt"] == "0" and labels["horovod.ai/role"] == "worker"
        assert all(pod["metadata"]["labels"][k] == v for k, v in labels.items())


def test_a_users_own_pod_affinity_is_kept() -> None:
    own = {
        "labelSelector": {"matchLabels": {"app": "cache"}},
        "topologyKey": "kubernetes.io/hostname",
    }
    template = {
        "spec": {
            "affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [own]}}
        }
    }
    plan = plan_for("Required", gang_api=False, worker={"template": template})
    terms = workers(plan)[0]["spec"]["affinity"]["podAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert terms[0] == own and terms[1]["topologyKey"] == RACK


def test_a_key_that_is_no_label_key_is_invalid() -> None:
    plan = decide(observe(body(scheduling={"topology": {"key": "not a key"}}), with_infra=False))
    assert cond(plan, "Failed")[:2] == ("True", "InvalidSpec")
    assert "topology" in cond(plan, "Failed")[2]
    assert created(plan) == []
