"""Every pod template the spec's validation lets through can be built.

The worker and launcher templates are free-form PodTemplateSpecs, checked only in the
places the builders touch (validation.check_template_shape). decide() no longer turns
a builder's exception into the user's InvalidSpec: one would be a bug of ours, logged
and retried, not the user's fault. So each template below, a full one with every
node in turn replaced by a value of another JSON type, is either refused by the
spec's validation (InvalidSpec, naming the field) or built into pods."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import ValidationError

from horovod_operator.api import parse_job
from horovod_operator.decide import decide
from tests.operator.test_decide import NO_GANG, RUNNING, body, created, observe, worker

FULL_TEMPLATE: dict[str, Any] = {
    "metadata": {"labels": {"team": "a"}, "annotations": {"note": "b"}},
    "spec": {
        "containers": [
            {
                "name": "main",
                "image": "other",
                "command": ["python"],
                "args": ["train.py"],
                "env": [{"name": "A", "value": "1"}],
                "envFrom": [{"configMapRef": {"name": "cm"}}],
                "ports": [{"containerPort": 9000}],
                "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                "resources": {"limits": {"nvidia.com/gpu": 1}, "requests": {"cpu": "1"}},
                "securityContext": {"runAsUser": 1000},
            },
            {"name": "side", "image": "side"},
        ],
        "initContainers": [{"name": "init", "image": "init"}],
        "volumes": [{"name": "data", "emptyDir": {}}],
        "tolerations": [{"key": "gpu", "operator": "Exists"}],
        "nodeSelector": {"pool": "gpu"},
        "imagePullSecrets": [{"name": "pull"}],
        "securityContext": {"fsGroup": 1000},
        "priorityClassName": "high",
        "resourceClaims": [],
    },
}
# A value of each JSON type, for every node of the template.
OTHERS: tuple[Any, ...] = (None, 7, "x", [], {}, [7], {"k": 7})


def paths(node: Any, at: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield at
    if isinstance(node, dict):
        for key, value in node.items():
            yield from paths(value, (*at, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from paths(value, (*at, index))


def replaced(template: dict[str, Any], at: tuple[Any, ...], value: Any) -> dict[str, Any]:
    result = copy.deepcopy(template)
    node: Any = result
    for step in at[:-1]:
        node = node[step]
    node[at[-1]] = value
    return result


MUTATIONS = [
    (at, value)
    for at in paths(FULL_TEMPLATE)
    if at  # the template itself as a scalar is covered by the validation's own tests
    for value in OTHERS
]


def _ids(case: tuple[tuple[Any, ...], Any]) -> str:
    at, value = case
    return ".".join(map(str, at)) + "=" + repr(value)


@pytest.mark.parametrize("role", ["worker", "launcher"])
def test_every_template_is_refused_by_validation_or_built(role: str) -> None:
    refused = built = 0
    for at, value in MUTATIONS:
        template = replaced(FULL_TEMPLATE, at, value)
        spec: dict[str, Any] = {**NO_GANG, role: {"template": template}}
        if role == "worker":
            spec["worker"]["replicas"] = 2
        new = body(**spec)
        try:
            parse_job(new)
        except ValidationError:
            refused += 1
            continue
        case = _ids((at, value))
        # A new job: its workers built. Workers ready: its launcher built.
        first = decide(observe(new, with_infra=False))
        assert "Pod/j-worker-1" in created(first), (case, created(first))
        pending = {**RUNNING, "phase": "Pending", "launcher": None}
        ready = decide(observe(body(pending, **spec), [worker(0), worker(1)]))
        assert created(ready) == ["Job/j-launcher"], (case, created(ready))
        built += 1
    # Both sides were exercised: some shapes are refused, most are built.
    assert refused > 10 and built > refused, (refused, built)


def test_a_merge_key_of_another_type_is_refused_naming_the_field() -> None:
    template = replaced(FULL_TEMPLATE, ("spec", "containers", 0, "env", 0, "name"), ["A"])
    with pytest.raises(ValidationError) as refused:
        parse_job(body(**NO_GANG, worker={"replicas": 2, "template": template}))
    assert "spec.containers[0].env[0].name must be a string, got list" in str(refused.value)


def test_containers_null_is_no_containers() -> None:
    template = replaced(FULL_TEMPLATE, ("spec", "containers"), None)
    plan = decide(observe(body(**NO_GANG, worker={"replicas": 2, "template": template})))
    pod = next(o for o in plan.creates if o["metadata"]["name"] == "j-worker-0")
    assert [c["name"] for c in pod["spec"]["containers"]] == ["worker"]
