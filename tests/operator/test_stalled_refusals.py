"""A job Stalled by a refusal stays so, across an operator restart, until what was
refused exists (stalled.refused_and_missing reads the children, not the plan)."""

from __future__ import annotations

from typing import Any

import pytest

from horovod_operator.api import HorovodJobStatus, WorkerCounts
from horovod_operator.children import sort_children
from horovod_operator.stalled import refused_and_missing, refused_phrase

UID = "u"


def owned(kind: str, name: str, **extra: Any) -> dict[str, Any]:
    meta = {
        "name": name,
        "uid": f"{name}-uid",
        "labels": {"horovod.ai/job-uid": UID},
        "ownerReferences": [{"uid": UID, "controller": True}],
        **extra,
    }
    return {"kind": kind, "metadata": meta, "status": {}}


def worker(index: int) -> dict[str, Any]:
    return owned(
        "Pod",
        f"j-worker-{index}",
        labels={
            "horovod.ai/job-uid": UID,
            "horovod.ai/role": "worker",
            "horovod.ai/attempt": "0",
        },
    )


STATUS = HorovodJobStatus(phase="Pending", workers=WorkerCounts(replicas=2))


@pytest.mark.parametrize(
    ("kind", "name", "missing", "present"),
    [
        ("Pod", "j-worker-1", {"Pod": [worker(0)]}, {"Pod": [worker(0), worker(1)]}),
        ("PodGroup", "j-attempt-0", {"Pod": [worker(0)]}, {"Pod": [worker(0), worker(1)]}),
        ("ConfigMap", "j-config", {}, {"ConfigMap": [owned("ConfigMap", "j-config")]}),
        ("Service", "j-worker", {}, {"Service": [owned("Service", "j-worker")]}),
    ],
)
def test_a_refused_object_is_missing_until_the_job_has_it(
    kind: str, name: str, missing: dict[str, list[Any]], present: dict[str, list[Any]]
) -> None:
    message = f"{refused_phrase(kind, name)} (503): unavailable; retrying with backoff"
    assert refused_and_missing(message, STATUS, sort_children(UID, missing))
    assert not refused_and_missing(message, STATUS, sort_children(UID, present))


def test_a_message_that_names_no_refusal_has_nothing_missing() -> None:
    assert not refused_and_missing("pod j-worker-1: no GPU", STATUS, sort_children(UID, {}))
