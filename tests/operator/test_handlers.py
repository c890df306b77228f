"""kopf settings: watches of pods and Jobs carry the operator's label selector."""

import kopf
from kopf._cogs.structs.references import Resource

from horovod_operator.handlers import configure_settings

PODS = Resource(group="", version="v1", plural="pods", kind="Pod", namespaced=True)
JOBS = Resource(group="batch", version="v1", plural="jobs", kind="Job", namespaced=True)
HVJOBS = Resource(
    group="horovod.ai",
    version="v1alpha1",
    plural="horovodjobs",
    kind="HorovodJob",
    namespaced=True,
)


def test_every_child_watch_is_label_selected() -> None:
    settings = kopf.OperatorSettings()
    configure_settings(settings)
    selector = ["app.kubernetes.io/managed-by=horovod-operator"]
    # kopf joins these into the labelSelector query parameter of its list and
    # watch requests (kopf/_cogs/clients/watching.py and fetching.py).
    assert settings.watching.label_selectors.collect(PODS) == selector
    assert settings.watching.label_selectors.collect(JOBS) == selector
    for plural, kind in (
        ("secrets", "Secret"),
        ("configmaps", "ConfigMap"),
        ("services", "Service"),
    ):
        resource = Resource(group="", version="v1", plural=plural, kind=kind, namespaced=True)
        assert settings.watching.label_selectors.collect(resource) == selector
    workloads = Resource(
        group="kueue.x-k8s.io", version="v1beta2", plural="workloads", kind="Workload"
    )
    assert settings.watching.label_selectors.collect(workloads) == selector
    assert settings.watching.label_selectors.collect(HVJOBS) == []


def test_persistence_is_explicit_and_posting_is_off() -> None:
    settings = kopf.OperatorSettings()
    configure_settings(settings)
    assert settings.persistence.finalizer == "horovod.ai/kopf-finalizer"
    assert isinstance(settings.persistence.progress_storage, kopf.AnnotationsProgressStorage)
    assert settings.posting.enabled is False


def test_the_pod_index_keeps_only_what_decisions_read() -> None:
    from horovod_operator.handlers import slim_pod

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
