"""spec.managedBy against the real API server: a job another controller runs gets
nothing from this operator; one MultiKueue should dispatch but cannot (no queue)
gets nothing either, and an Event that says why.

MultiKueue's dispatch itself, across two control planes: test_multikueue.py.
"""

from __future__ import annotations

import json

from tests.support.cluster import KubeCluster
from tests.support.operator import Jobs, hvjob

MULTIKUEUE = "kueue.x-k8s.io/multikueue"
OTHER = "example.com/trainer"


def test_a_job_managed_elsewhere_gets_no_child_and_no_status(
    jobs: Jobs, namespace: str, cluster: KubeCluster
) -> None:
    jobs.apply(hvjob("elsewhere", managedBy=MULTIKUEUE))  # no queue: nothing to dispatch
    jobs.apply(hvjob("other", managedBy=OTHER))
    # The control: an ordinary job applied after it starts, so the operator has
    # seen both by the time this one runs.
    jobs.apply(hvjob("here", managedBy="horovod.ai/horovod-operator"))
    jobs.wait_running("here")
    jobs.op.stays(
        lambda: all(
            not jobs.status(name) and not any(jobs.children(name).values())
            for name in ("elsewhere", "other")
        ),
        seconds=3,
        message="no status and no child for a job another controller manages",
    )
    said = jobs.op.wait(
        lambda: [e["message"] for e in jobs.events("elsewhere") if e["reason"] == "NotDispatched"],
        30,
        "the NotDispatched Event",
    )
    assert "spec.scheduling.queue is unset" in said[0], said
    assert jobs.events("other") == []
    # Its status is the other controller's to write; this operator leaves it as it is.
    cluster.kubectl(
        "patch", "hvjob", "elsewhere", "-n", namespace, "--subresource=status",
        "--type=merge", "-p", json.dumps({"status": {"phase": "Running"}}),
    )  # fmt: skip
    jobs.op.stays(
        lambda: (
            jobs.status("elsewhere") == {"phase": "Running"}
            and not any(jobs.children("elsewhere").values())
        ),
        seconds=3,
        message="the mirrored status kept and still no child",
    )
    assert f"job {namespace}/other: managedBy {OTHER}; left to it" in jobs.op.log_tail(200)


def test_managed_by_cannot_change(jobs: Jobs, namespace: str, cluster: KubeCluster) -> None:
    jobs.apply(hvjob("owned"))
    jobs.wait_running("owned")
    for value in (MULTIKUEUE, None):
        patch = {"spec": {"managedBy": value}}
        if value is None:
            name = "given"
            jobs.apply(hvjob(name, managedBy=MULTIKUEUE))
        else:
            name = "owned"
        proc = cluster.kubectl(
            "patch", "hvjob", name, "-n", namespace, "--type=merge", "-p", json.dumps(patch),
            check=False,
        )  # fmt: skip
        assert proc.returncode != 0, (name, proc.stdout)
        assert "spec.managedBy cannot change" in proc.stderr, proc.stderr


def test_a_malformed_manager_is_refused_at_apply_time(
    jobs: Jobs, namespace: str, cluster: KubeCluster
) -> None:
    manifest = hvjob("bad-manager", managedBy="not a controller")
    proc = cluster.kubectl(
        "apply", "-n", namespace, "-f", "-", input=json.dumps(manifest), check=False
    )
    assert proc.returncode != 0 and "spec.managedBy" in proc.stderr, proc.stderr
