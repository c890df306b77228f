"""Discovery fails closed, against the real API server: Kueue's API group served by
an aggregated APIService whose backend is down answers discovery with 503, as an
API incident does. A job with a queue then gets neither a Workload nor a pod (it
must not run outside its quota) and says why; when discovery answers, the job
goes on from what the answer says."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.support.cluster import KubeCluster
from tests.support.operator import Jobs, hvjob

KUEUE_API = "v1beta2.kueue.x-k8s.io"


def _absent(cluster: KubeCluster, name: str) -> bool:
    proc = cluster.kubectl("get", "apiservice", name, "--ignore-not-found", "-o", "name")
    return not proc.stdout.strip()


@pytest.fixture
def kueue_api_down(cluster: KubeCluster, namespace: str) -> Iterator[str]:
    """Kueue's group version as an APIService whose Service has no backend (before the
    operator starts, so its first check meets the 503)."""
    from localcluster.poll import wait_for

    # Kueue's CRDs from tests/operator/integration/test_kueue.py go with --wait=false.
    wait_for(lambda: _absent(cluster, KUEUE_API), 120, 1.0, "Kueue's API gone from a test before")
    cluster.apply(
        {
            "apiVersion": "apiregistration.k8s.io/v1",
            "kind": "APIService",
            "metadata": {"name": KUEUE_API},
            "spec": {
                "group": "kueue.x-k8s.io",
                "version": "v1beta2",
                "service": {"namespace": namespace, "name": "no-kueue-here", "port": 443},
                "insecureSkipTLSVerify": True,
                "groupPriorityMinimum": 100,
                "versionPriority": 100,
            },
        }
    )
    raw = cluster.kubectl("get", "--raw", "/apis/kueue.x-k8s.io/v1beta2", check=False)
    assert raw.returncode != 0 and "ServiceUnavailable" in raw.stderr, raw
    try:
        yield KUEUE_API
    finally:
        cluster.kubectl("delete", "apiservice", KUEUE_API, "--ignore-not-found")


def test_a_queued_job_waits_while_discovery_fails_and_goes_on_when_it_answers(
    kueue_api_down: str, jobs: Jobs, cluster: KubeCluster, namespace: str
) -> None:
    job = hvjob("queued", scheduling={"queue": "gpus", "gang": {"policy": "None"}})
    jobs.apply(job)

    def stalled() -> dict[str, object] | None:
        return jobs.condition("queued", "Stalled")

    why = jobs.op.wait(stalled, 30, "queued Stalled")
    assert why["reason"] == "APIDiscoveryPending", why
    assert "kueue.x-k8s.io/v1beta2" in str(why["message"]), why
    assert "503" in str(why["message"]) or "unavailable" in str(why["message"]).lower(), why
    # Asked again with backoff meanwhile, and nothing of the job is created.
    jobs.op.stays(
        lambda: jobs.pods("queued") == [] and jobs.children("queued")["secrets"] == [],
        4.0,
        "nothing of queued created",
    )
    assert jobs.op.log_tail(200).count("cannot tell whether kueue.x-k8s.io/v1beta2") >= 2
    workloads = cluster.kubectl("get", "--raw", f"/api/v1/namespaces/{namespace}/pods")
    assert json.loads(workloads.stdout)["items"] == []

    # The incident ends: discovery answers (404: no Kueue here), the queue is only the
    # pods' label, as on any cluster without Kueue, and the job starts.
    cluster.kubectl("delete", "apiservice", kueue_api_down)
    jobs.wait_running("queued", timeout=60)
    assert jobs.condition("queued", "Stalled") is None
    assert "Kueue admission (kueue.x-k8s.io/v1beta2 workloads): not served" in jobs.op.log_tail(400)
