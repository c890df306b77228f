"""The benchmark's statistics and audit-log counting (pure)."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from bench import audit, manifests, stats


def test_percentile_interpolates_like_numpy() -> None:
    data = [1.0, 2.0, 3.0, 4.0, 5.0]
    assert stats.percentile(data, 50) == 3.0
    assert stats.percentile(data, 95) == pytest.approx(4.8)
    assert stats.percentile(data, 0) == 1.0
    assert stats.percentile(data, 100) == 5.0
    assert stats.percentile([7.0], 95) == 7.0


def test_percentile_rejects_nothing_and_bad_q() -> None:
    with pytest.raises(ValueError):
        stats.percentile([], 50)
    with pytest.raises(ValueError):
        stats.percentile([1.0], 101)


def test_summarize() -> None:
    s = stats.summarize([0.3, 0.1, 0.2])
    assert s["n"] == 3
    assert s["median"] == 0.2
    assert s["min"] == 0.1 and s["max"] == 0.3
    assert s["p95"] == 0.29 and s["p99"] == 0.298
    assert s["samples"] == [0.3, 0.1, 0.2]
    assert stats.summarize([]) == {"n": 0}


def test_ratio_of_medians() -> None:
    ours, theirs = stats.summarize([1.0, 1.0]), stats.summarize([4.0, 4.0])
    assert stats.ratio(ours, theirs) == 0.25
    assert stats.ratio(ours, {"n": 0}) is None
    assert stats.ratio(None, theirs) is None
    assert stats.ratio(ours, stats.summarize([0.0])) is None


def _event(
    audit_id: str, agent: str, verb: str, resource: str, ns: str | None, code: int = 201, **ref: str
) -> str:
    obj_ref = {"resource": resource, **ref}
    if ns is not None:
        obj_ref["namespace"] = ns
    return json.dumps(
        {
            "auditID": audit_id,
            "userAgent": agent,
            "verb": verb,
            "objectRef": obj_ref,
            "responseStatus": {"metadata": {}, "code": code},
        }
    )


def test_count_requests_by_agent_namespace_and_verb() -> None:
    lines = [
        _event("1", "horovod-operator", "create", "pods", "ns1", name="j-worker-0"),
        _event("2", "horovod-operator", "create", "pods", "ns1", name="j-worker-1"),
        _event("2", "horovod-operator", "create", "pods", "ns1", name="j-worker-1"),  # dup
        _event(
            "3", "horovod-operator", "patch", "horovodjobs", "ns1", name="j", subresource="status"
        ),
        _event("4", "horovod-operator", "create", "events", "ns1"),  # generateName: no name
        _event("8", "horovod-operator", "deletecollection", "pods", "ns1"),  # names none
        _event("5", "kopf/1.45.2", "watch", "pods", "ns1"),
        _event("6", "mpi-operator/v0.0.0", "create", "pods", "ns1", name="x"),
        _event("7", "horovod-operator", "create", "pods", "other", name="y"),
        # A second try of a create the cache did not show yet: refused, counted apart.
        _event("9", "horovod-operator", "create", "jobs", "ns1", code=201, name="j-launcher"),
        _event("10", "horovod-operator", "create", "jobs", "ns1", code=409, name="j-launcher"),
        "not json",
    ]
    counts = audit.count_requests(lines, ("horovod-operator", "kopf/"), ["ns1"])
    assert counts["namespaced"] == Counter(
        {
            "create pods": 2,
            "patch horovodjobs/status": 1,
            "create events": 1,
            "deletecollection pods": 1,
            "create jobs": 1,
            "create jobs (409)": 1,
        }
    )
    assert counts["other"] == Counter({"watch pods": 1})


def test_per_job_totals() -> None:
    out = audit.per_job(Counter({"create pods": 16, "get configmaps": 2, "patch x": 4}), 2)
    assert out["create pods"] == 8
    assert out["writes (total)"] == 10
    assert out["all (total)"] == 11
    assert audit.per_job(Counter(), 0) == {}
    refused = audit.per_job(Counter({"create jobs": 2, "create jobs (409)": 1}), 2)
    assert refused["create jobs"] == 1 and refused["writes (total)"] == 1.5


def test_mpi_phase_from_conditions() -> None:
    def job(*conds: tuple[str, str]) -> dict[str, object]:
        return {"status": {"conditions": [{"type": t, "status": s} for t, s in conds]}}

    assert manifests.mpi_phase({}) is None
    assert manifests.mpi_phase(job(("Created", "True"))) == "Pending"
    assert manifests.mpi_phase(job(("Created", "True"), ("Running", "True"))) == "Running"
    assert manifests.mpi_phase(job(("Running", "False"), ("Succeeded", "True"))) == "Succeeded"
    assert manifests.horovod_phase({"status": {"phase": "Running"}}) == "Running"


def test_pod_roles_match_both_operators_naming() -> None:
    assert manifests.pod_role("j0-worker-3") == ("j0", "worker")
    assert manifests.pod_role("b001-launcher-x7k2p") == ("b001", "launcher")
    assert manifests.pod_role("something-else") is None


def test_equivalent_jobs_have_the_same_shape() -> None:
    ours = manifests.horovod_job("a", 8)
    theirs = manifests.mpi_job("a", 8)
    worker = theirs["spec"]["mpiReplicaSpecs"]["Worker"]
    assert ours["spec"]["worker"]["replicas"] == worker["replicas"] == 8
    container = worker["template"]["spec"]["containers"][0]
    assert container["image"] == ours["spec"]["image"]
    assert container["resources"] == ours["spec"]["worker"]["resources"]
    assert theirs["spec"]["slotsPerWorker"] == ours["spec"]["slotsPerWorker"] == 1
    policy = ours["spec"]["runPolicy"]
    assert theirs["spec"]["launcherCreationPolicy"] == policy["launcherCreationPolicy"]
    assert theirs["spec"]["runPolicy"]["cleanPodPolicy"] == policy["cleanPodPolicy"]
