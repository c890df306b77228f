"""What the operator keeps of watched objects, which it watches, and kopf's settings."""

from typing import Any

import kopf

from horovod_operator import watches
from horovod_operator.children import launcher_state, sort_children
from horovod_operator.handlers import configure_settings
from horovod_operator.views import slim_launcher_job, slim_owned, slim_pod, whole
from horovod_operator.watches import Store


def test_every_child_watch_is_label_selected() -> None:
    # Server-side label selectors: the operator never receives or keeps pods and
    # Jobs that are not its own, however big the cluster.
    children = [k for k in (*watches.ALWAYS, watches.WORKLOADS) if k is not watches.JOBS]
    # Not Secrets: watching them needs cluster-wide list/watch (observing.Observer._secret).
    assert {k.kind for k in children} == {
        "Pod", "Job", "ConfigMap", "Service", "Workload",
    }  # fmt: skip
    for kind in children:
        assert kind.selector == "app.kubernetes.io/managed-by=horovod-operator"
    assert watches.JOBS.selector is None


def test_paths_and_the_job_each_object_belongs_to() -> None:
    assert watches.PODS.path("ns") == "/api/v1/namespaces/ns/pods"
    assert watches.LAUNCHERS.path("") == "/apis/batch/v1/jobs"
    assert watches.JOBS.path("a") == "/apis/horovod.ai/v1alpha1/namespaces/a/horovodjobs"
    assert watches.JOBS.key({"metadata": {"namespace": "a", "name": "j"}}) == ("a", "j")
    labelled = {"metadata": {"namespace": "a", "labels": {"horovod.ai/job-name": "j"}}}
    assert watches.PODS.key(labelled) == ("a", "j")
    assert watches.PODS.key({"metadata": {"namespace": "a", "labels": {}}}) is None


def test_a_store_keeps_objects_by_job_and_forgets_them() -> None:
    store = Store()
    assert store.put("u1", ("a", "j"), {"n": 1}) is None
    store.put("u2", ("a", "j"), {"n": 2})
    store.put("u3", ("b", "k"), {"n": 3})
    assert sorted(o["n"] for o in store[("a", "j")]) == [1, 2]
    assert store.uids("a") == {"u1", "u2"} and len(store.uids("")) == 3
    # An object relabelled to another job moves, and the old job hears of it.
    assert store.put("u2", ("a", "other"), {"n": 2}) == ("a", "j")
    assert [o["n"] for o in store[("a", "j")]] == [1]
    assert store.remove("u1") == ("a", "j")
    assert ("a", "j") not in store and store.remove("u1") is None
    assert set(store) == {("a", "other"), ("b", "k")}


def test_kopf_posts_nothing() -> None:
    settings = kopf.OperatorSettings()
    configure_settings(settings)
    assert settings.posting.enabled is False
    # Nor does it scan (list and watch) the cluster's CRDs: it serves none through kopf.
    assert settings.scanning.disabled is True


def test_the_secret_view_keeps_no_key() -> None:
    secret = {
        "kind": "Secret",
        "metadata": {"name": "s", "uid": "u", "labels": {}, "resourceVersion": "9"},
        "data": {"id_ed25519": "c2VjcmV0"},
    }
    assert slim_owned(secret) == {
        "kind": "Secret",
        "metadata": {"name": "s", "uid": "u", "labels": {}},
    }


def test_jobs_are_kept_whole_but_for_managed_fields() -> None:
    job: dict[str, Any] = {
        "kind": "HorovodJob",
        "metadata": {"name": "j", "managedFields": [{"manager": "kubectl"}]},
        "spec": {"worker": {"replicas": 2}},
    }
    kept = whole(job)
    assert kept == {"kind": "HorovodJob", "metadata": {"name": "j"}, "spec": job["spec"]}
    assert job["metadata"]["managedFields"]  # the watch's own copy is not changed
    assert whole(kept) == kept


def test_the_pod_index_keeps_only_what_decisions_read() -> None:
    pod = {
        "metadata": {
            "name": "j-worker-0",
            "uid": "p1",
            "labels": {"a": "b"},
            "ownerReferences": [{"uid": "u", "controller": True}],
            "creationTimestamp": "t",
            "managedFields": [{"manager": "x" * 5000}],
            "annotations": {"big": "y" * 5000},
        },
        "spec": {
            "containers": [{"name": "worker", "env": [{"name": "A", "value": "z" * 5000}]}],
            "nodeName": "n1",
            "volumes": [{"name": "v"}],
        },
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": "worker", "state": {"running": {}}}],
            "podIP": "10.0.0.1",
        },
    }
    slim = slim_pod(pod)
    assert slim == {
        "kind": "Pod",
        "metadata": {
            "name": "j-worker-0",
            "uid": "p1",
            "labels": {"a": "b"},
            "ownerReferences": [{"uid": "u", "controller": True}],
            "creationTimestamp": "t",
        },
        "spec": {"containers": [{"name": "worker"}], "nodeName": "n1"},
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": "worker", "state": {"running": {}}}],
        },
    }


def test_a_launcher_job_is_kept_without_its_template_and_decides_the_same() -> None:
    uid = "job-uid"
    job: dict[str, Any] = {
        "kind": "Job",
        "metadata": {
            "name": "j-launcher",
            "namespace": "ns",
            "uid": "launcher-uid",
            "resourceVersion": "7",
            "labels": {
                "horovod.ai/job-name": "j",
                "horovod.ai/role": "launcher",
                "horovod.ai/attempt": "0",
            },
            "ownerReferences": [{"kind": "HorovodJob", "uid": uid, "controller": True}],
            "managedFields": [{"manager": "kube-controller-manager"}],
        },
        "spec": {"backoffLimit": 0, "template": {"spec": {"containers": [{"name": "l"}]}}},
        "status": {
            "conditions": [{"type": "Complete", "status": "True"}],
            "succeeded": 1,
        },
    }
    kept = slim_launcher_job(job)
    assert "spec" not in kept and "managedFields" not in kept["metadata"]
    assert kept["status"] == job["status"]
    pod = {
        "metadata": {
            "name": "j-launcher-x",
            "labels": {"horovod.ai/role": "launcher", "horovod.ai/attempt": "0"},
            "ownerReferences": [{"kind": "Job", "uid": "launcher-uid", "controller": True}],
        },
        "status": {"phase": "Running"},
    }
    # What the decisions read of it is the same as from the whole Job: its pods
    # are told apart by its UID, and its Complete condition ends the attempt.
    states = []
    for launcher in (job, kept):
        children = sort_children(uid, {"Job": [launcher], "Pod": [pod]})
        assert children.launcher_job is launcher
        assert [p["metadata"]["name"] for p in children.launcher_pods] == ["j-launcher-x"]
        states.append(launcher_state(children, 0))
    assert states[0] == states[1] and states[0] is not None
    assert states[0].phase == "Succeeded"
