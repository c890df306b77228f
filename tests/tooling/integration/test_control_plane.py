"""The local control plane behaves like a real cluster (issue: local control plane)."""

from __future__ import annotations

import json
from typing import Any

from localcluster import crds
from localcluster.paths import REPO
from localcluster.poll import wait_for
from tests.support.cluster import KubeCluster

TESTDATA = REPO / "tests" / "testdata"


def test_api_server_answers(cluster: KubeCluster) -> None:
    assert cluster.kubectl("get", "--raw", "/readyz").stdout.strip() == "ok"
    version = json.loads(cluster.kubectl("version", "-o", "json").stdout)
    assert version["serverVersion"]["gitVersion"].startswith("v1.")
    nodes = cluster.get("nodes")["items"]
    assert len(nodes) >= 4
    assert all(
        n["status"]["allocatable"]["nvidia.com/gpu"] == "8"
        for n in nodes
        if n["metadata"]["labels"].get("horovod.ai/node-kind") == "kwok"
    )


WIDGET_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.test.horovod.ai"},
    "spec": {
        "group": "test.horovod.ai",
        "names": {"kind": "Widget", "plural": "widgets", "singular": "widget"},
        "scope": "Namespaced",
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "additionalPrinterColumns": [
                    {"name": "Size", "type": "integer", "jsonPath": ".spec.size"},
                    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
                    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                ],
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {"type": "object", "properties": {"size": {"type": "integer"}}},
                            "status": {
                                "type": "object",
                                "properties": {"phase": {"type": "string"}},
                            },
                        },
                    }
                },
            }
        ],
    },
}


def test_crd_with_status_subresource_and_printer_columns(
    cluster: KubeCluster, namespace: str
) -> None:
    cluster.apply(WIDGET_CRD)
    crds.wait_established(cluster.kubectl, ["widgets.test.horovod.ai"], timeout=30)
    widget = {
        "apiVersion": "test.horovod.ai/v1",
        "kind": "Widget",
        "metadata": {"name": "w1"},
        "spec": {"size": 3},
    }
    wait_for(
        lambda: cluster.apply(widget, namespace, check=False).returncode == 0,
        20,
        message="the Widget kind to be served",
    )
    # The status subresource: a status change goes through /status only.
    cluster.kubectl(
        "patch",
        "widget",
        "w1",
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        '{"status": {"phase": "Ready"}}',
    )
    table = cluster.kubectl("get", "widgets", "-n", namespace).stdout.splitlines()
    assert table[0].split() == ["NAME", "SIZE", "PHASE", "AGE"]
    assert table[1].split()[:3] == ["w1", "3", "Ready"]


def _pod(name: str, gpus: int) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "example.org/trainer:1",
                    "resources": {"limits": {"nvidia.com/gpu": gpus}},
                }
            ]
        },
    }


def test_gpu_pod_is_scheduled_on_a_kwok_node_and_runs(cluster: KubeCluster, namespace: str) -> None:
    cluster.apply(_pod("gpu2", 2), namespace)
    pod = wait_for(
        lambda: (
            (p := cluster.get("pod", "gpu2", namespace))["status"].get("phase") == "Running" and p
        ),
        30,
        message="pod gpu2 Running",
    )
    assert pod["spec"]["nodeName"].startswith("kwok-gpu-")
    ready = {c["type"]: c["status"] for c in pod["status"]["conditions"]}
    assert ready["Ready"] == "True"
    assert pod["status"]["podIP"]


def test_pod_asking_too_many_gpus_stays_pending(cluster: KubeCluster, namespace: str) -> None:
    cluster.apply(_pod("gpu9", 9), namespace)

    def failed_scheduling() -> list[dict[str, object]]:
        events = cluster.get("events", namespace=namespace)["items"]
        return [
            e
            for e in events
            if e["reason"] == "FailedScheduling" and e["involvedObject"]["name"] == "gpu9"
        ]

    events = wait_for(failed_scheduling, 30, message="a FailedScheduling event")
    assert "Insufficient nvidia.com/gpu" in str(events[0]["message"])
    pod = cluster.get("pod", "gpu9", namespace)
    assert pod["status"]["phase"] == "Pending"
    assert "nodeName" not in pod["spec"]


def test_deleting_an_owner_garbage_collects_its_children(
    cluster: KubeCluster, namespace: str
) -> None:
    cluster.apply(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "owner"}}, namespace
    )
    owner = cluster.get("configmap", "owner", namespace)
    child = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": "child",
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "name": "owner",
                    "uid": owner["metadata"]["uid"],
                }
            ],
        },
        "stringData": {"k": "v"},
    }
    cluster.apply(child, namespace)
    cluster.kubectl("delete", "configmap", "owner", "-n", namespace)
    wait_for(
        lambda: not cluster.exists("secret", "child", namespace),
        30,
        message="the garbage collector to delete the owned Secret",
    )


def test_job_completes_when_kwok_marks_its_pod_succeeded(
    cluster: KubeCluster, namespace: str
) -> None:
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "once"},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "main", "image": "example.org/trainer:1"}],
                }
            },
        },
    }
    cluster.apply(job, namespace)
    pods = wait_for(
        lambda: [
            p
            for p in cluster.get(
                "pods", namespace=namespace, selector="batch.kubernetes.io/job-name=once"
            )["items"]
            if p["status"].get("phase") == "Running"
        ],
        30,
        message="the Job's pod Running",
    )
    job_now = cluster.get("job", "once", namespace)
    assert not any(c["type"] == "Complete" for c in job_now["status"].get("conditions", []))
    cluster.set_pod_phase(namespace, pods[0]["metadata"]["name"], "Succeeded")
    cluster.kubectl(
        "wait", "--for=condition=Complete", "job/once", "-n", namespace, "--timeout=60s"
    )


def test_kwok_fails_a_pod_with_the_chosen_exit_code_and_reason(
    cluster: KubeCluster, namespace: str
) -> None:
    cluster.apply(_pod("oom", 1), namespace)
    wait_for(
        lambda: cluster.get("pod", "oom", namespace)["status"].get("phase") == "Running",
        30,
        message="pod oom Running",
    )
    cluster.set_pod_phase(namespace, "oom", "Failed", exit_code=137, reason="OOMKilled")
    pod = wait_for(
        lambda: (p := cluster.get("pod", "oom", namespace))["status"]["phase"] == "Failed" and p,
        30,
        message="pod oom Failed",
    )
    term = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (term["exitCode"], term["reason"]) == (137, "OOMKilled")


def test_kwok_evicts_a_pod(cluster: KubeCluster, namespace: str) -> None:
    cluster.apply(_pod("evictee", 1), namespace)
    wait_for(
        lambda: cluster.get("pod", "evictee", namespace)["status"].get("phase") == "Running",
        30,
        message="pod evictee Running",
    )
    cluster.set_pod_phase(namespace, "evictee", "Failed", exit_code=137, reason="Evicted")
    pod = wait_for(
        lambda: (
            (p := cluster.get("pod", "evictee", namespace))["status"]["phase"] == "Failed" and p
        ),
        30,
        message="pod evictee Failed",
    )
    assert pod["status"]["reason"] == "Evicted"


def test_helm_install_and_uninstall(cluster: KubeCluster, namespace: str) -> None:
    chart = str(TESTDATA / "chart")
    cluster.helm("lint", chart)
    cluster.helm("install", "smoke", chart, "-n", namespace, "--set", "message=hi", "--wait")
    cm = cluster.get("configmap", "smoke-smoke", namespace)
    assert cm["data"] == {"message": "hi"}
    assert "smoke" in cluster.helm("list", "-n", namespace, "-q").stdout.split()
    cluster.helm("uninstall", "smoke", "-n", namespace, "--wait")
    assert not cluster.exists("configmap", "smoke-smoke", namespace)


def test_server_side_dry_run_rejects_an_invalid_object(
    cluster: KubeCluster, namespace: str
) -> None:
    bad: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "bad"},
        "spec": {
            "replicas": -1,
            "selector": {"matchLabels": {"app": "x"}},
            "template": {
                "metadata": {"labels": {"app": "x"}},
                "spec": {"containers": [{"name": "c", "image": "i"}]},
            },
        },
    }
    proc = cluster.apply(bad, namespace, False, "--server-side", "--dry-run=server")
    assert proc.returncode != 0
    assert "spec.replicas: Invalid value: -1" in proc.stderr
    assert not cluster.exists("deployment", "bad", namespace)
    # The same object made valid passes the same dry run and still creates nothing.
    bad["spec"]["replicas"] = 1
    ok = cluster.apply(bad, namespace, False, "--server-side", "--dry-run=server")
    assert ok.returncode == 0, ok.stderr
    assert not cluster.exists("deployment", "bad", namespace)
