"""GPUs through Dynamic Resource Allocation, against the real kube-scheduler: it
allocates devices from ResourceSlices this test publishes for two kwok nodes (no
driver is needed to allocate; kwok plays the kubelet), and the operator counts
the GPUs from the worker's ResourceClaimTemplate (claims.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from localcluster.paths import REPO
from tests.operator.integration.conftest import POOL_LABEL
from tests.support import dra
from tests.support.cluster import KubeCluster
from tests.support.operator import Jobs, hvjob


@pytest.fixture
def gpu_slices(cluster: KubeCluster, pool: dict[str, Any]) -> Iterator[list[str]]:
    with dra.gpu_slices(cluster, pool["nodes"]) as slices:
        yield slices


def _dra_job(name: str, pool_template: dict[str, Any], claim_template: str, **spec: Any) -> Any:
    return dra.with_claim(hvjob(name, replicas=2, **spec), claim_template, pool_template)


def _env(pod: dict[str, Any]) -> dict[str, str]:
    container = next(c for c in pod["spec"]["containers"] if c["name"] == "worker")
    return {e["name"]: e.get("value", "") for e in container.get("env") or []}


def test_two_jobs_competing_for_eight_claimed_gpus_run_one_after_the_other(
    jobs: Jobs,
    cluster: KubeCluster,
    namespace: str,
    pool: dict[str, Any],
    gpu_slices: list[str],
) -> None:
    # A job whose claim template does not exist yet waits, saying which and where.
    jobs.apply(_dra_job("first", pool["template"], "four-gpus", slotsPerWorker=4))
    stalled = jobs.op.wait(lambda: jobs.condition("first", "Stalled"), 30, "first Stalled")
    assert stalled["reason"] == "ClaimTemplateNotFound", stalled
    assert "ResourceClaimTemplate four-gpus" in stalled["message"], stalled
    assert f"namespace {namespace}" in stalled["message"], stalled
    assert jobs.pods("first") == []
    jobs.op.wait(
        lambda: "ClaimTemplateNotFound" in [r for r, _ in jobs.warnings("first")], 10, "a Warning"
    )
    # A restart (a failover's new leader is a new process too) keeps it as it was,
    # without a second Warning: the operator keeps nothing of it but the status.
    jobs.op.stop()
    jobs.op.start()
    jobs.op.stays(lambda: jobs.condition("first", "Stalled") == stalled, 12.0, "Stalled unchanged")
    assert [r for r, _ in jobs.warnings("first")].count("ClaimTemplateNotFound") == 1

    # Once it exists, the workers are created with the GPUs counted from it.
    dra.apply(cluster, dra.claim_template("four-gpus", 4), namespace=namespace)
    jobs.wait_running("first", timeout=60)
    pods = jobs.pods("first")
    assert {_env(p)["HVJOB_GPUS_PER_WORKER"] for p in pods} == {"4"}
    assert sorted(p["spec"]["nodeName"] for p in pods) == sorted(pool["nodes"])
    # The scheduler allocated each worker its own claim of four devices.
    claims = json.loads(
        cluster.kubectl("get", "resourceclaims", "-n", namespace, "-o", "json").stdout
    )["items"]
    allocated = [c for c in claims if (c.get("status") or {}).get("allocation")]
    assert len(allocated) == 2, claims
    for claim in allocated:
        assert len(claim["status"]["allocation"]["devices"]["results"]) == dra.DEVICES_PER_NODE

    # A second job of the same size finds no free device and says what the
    # scheduler says.
    jobs.apply(_dra_job("second", pool["template"], "four-gpus", slotsPerWorker=4))
    waiting = jobs.op.wait(
        lambda: (c := jobs.condition("second", "Stalled")) and c["reason"] == "Unschedulable" and c,
        60,
        "second Stalled by the scheduler",
    )
    assert "cannot allocate all claims" in waiting["message"], waiting
    assert not [p for p in jobs.pods("second") if p["spec"].get("nodeName")]

    # The first ends; its claims go with its pods, and the second gets the devices.
    launcher = jobs.wait_running("first")
    cluster.set_pod_phase(namespace, launcher, "Succeeded")
    jobs.wait_phase("first", "Succeeded")
    jobs.wait_running("second", timeout=120)
    assert jobs.condition("second", "Stalled") is None


def test_more_ranks_than_claimed_gpus_waits_and_names_the_fix(
    jobs: Jobs,
    cluster: KubeCluster,
    namespace: str,
    pool: dict[str, Any],
    gpu_slices: list[str],
) -> None:
    dra.apply(cluster, dra.claim_template("two-gpus", 2), namespace=namespace)
    jobs.apply(_dra_job("greedy", pool["template"], "two-gpus", slotsPerWorker=4))
    stalled = jobs.op.wait(lambda: jobs.condition("greedy", "Stalled"), 30, "greedy Stalled")
    assert stalled["reason"] == "TooFewGPUs", stalled
    assert "slotsPerWorker: 4 is more than the 2 GPU(s) per worker" in stalled["message"]
    jobs.op.stays(lambda: jobs.pods("greedy") == [], 2.0, "no worker created")
    # Fixed in the template (its spec cannot change: replaced): it starts, within
    # the template's read interval and the retry (10 s each).
    cluster.kubectl("delete", "resourceclaimtemplate", "two-gpus", "-n", namespace)
    dra.apply(cluster, dra.claim_template("two-gpus", 4), namespace=namespace)
    jobs.wait_running("greedy", timeout=60)
    assert {_env(p)["HVJOB_GPUS_PER_WORKER"] for p in jobs.pods("greedy")} == {"4"}


def test_the_dra_example_runs_where_gpus_are_published(
    jobs: Jobs,
    cluster: KubeCluster,
    namespace: str,
    pool: dict[str, Any],
    gpu_slices: list[str],
) -> None:
    docs = list(yaml.safe_load_all((REPO / "examples" / "dra" / "pytorch-digits-dra.yaml").open()))
    (job,) = [d for d in docs if d["kind"] == "HorovodJob"]
    # Only the pool's nodes have devices, and only this test's pods tolerate them.
    job["spec"]["worker"]["template"]["spec"].update(pool["template"]["spec"])
    job["spec"]["image"] = "horovod-worker:0.1.0"
    dra.apply(cluster, *docs, namespace=namespace)
    name = job["metadata"]["name"]
    jobs.wait_running(name, timeout=60)
    assert {_env(p)["HVJOB_GPUS_PER_WORKER"] for p in jobs.pods(name)} == {"1"}
    assert {p["spec"]["nodeName"] for p in jobs.pods(name)} <= set(pool["nodes"])


DOMAIN = "domain.example.com"  # a device every node of the pool reaches: no GPU


def test_a_gang_shares_one_claim_across_its_workers(
    jobs: Jobs,
    cluster: KubeCluster,
    namespace: str,
    pool: dict[str, Any],
    gpu_slices: list[str],
) -> None:
    # One device reachable from both of the pool's nodes (as an NVLink domain is),
    # which only a claim shared by the whole gang can give every worker.
    domain_slice = f"{namespace[:40]}-domain"
    dra.apply(
        cluster,
        dra.device_class(DOMAIN),
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": domain_slice},
            "spec": {
                "driver": DOMAIN,
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": POOL_LABEL, "operator": "In", "values": [namespace]}
                            ]
                        }
                    ]
                },
                "pool": {"name": domain_slice, "generation": 1, "resourceSliceCount": 1},
                "devices": [{"name": "channel-0"}],
            },
        },
    )
    try:
        domain_template = dra.claim_template("domain", 1, DOMAIN)
        dra.apply(cluster, dra.claim_template("four-gpus", 4), domain_template, namespace=namespace)
        shared = {"name": "domain", "resourceClaimTemplateName": "domain"}
        jobs.apply(
            _dra_job(
                "nvlink",
                pool["template"],
                "four-gpus",
                slotsPerWorker=4,
                scheduling={"gang": {"resourceClaims": [shared]}},
            )
        )
        jobs.wait_running("nvlink", timeout=60)
        group = cluster.get("podgroup", "nvlink-gang-0-2", namespace)
        assert group["spec"]["resourceClaims"] == [shared]
        (made,) = group["status"]["resourceClaimStatuses"]
        claim = cluster.get("resourceclaim", made["resourceClaimName"], namespace)
        (device,) = claim["status"]["allocation"]["devices"]["results"]
        assert device["device"] == "channel-0"
        pods = jobs.pods("nvlink")
        assert sorted(p["spec"]["nodeName"] for p in pods) == sorted(pool["nodes"])
        for pod in pods:
            used = {
                s["name"]: s.get("resourceClaimName")
                for s in pod["status"]["resourceClaimStatuses"]
            }
            # Its own four GPUs, and the gang's one channel.
            assert used["domain"] == made["resourceClaimName"], pod["status"]
            assert used["gpus"] != made["resourceClaimName"]
        # Three claims in all: one per worker and one for the gang.
        assert len(cluster.get("resourceclaims", namespace=namespace)["items"]) == 3
    finally:
        cluster.kubectl("delete", "resourceslice", domain_slice, "--wait=false", check=False)
