"""kinds.py, the one table of the kinds the operator reads or writes: every object the
builders make has its row (its path, its create stage), and the table says what the
applier and the cleanup used to spell out themselves."""

from __future__ import annotations

import pytest

from horovod_operator import builders, kinds, watches
from horovod_operator.children import sort_children
from horovod_operator.sshkeys import KeyPair
from tests.operator.test_podgroups import make_job

KEYS = KeyPair(private_openssh="PRIVATE", public_openssh="PUBLIC")


@pytest.mark.parametrize("policy", ["Native", "Volcano", "Coscheduling"])
def test_every_child_the_builders_make_has_a_row_with_a_create_stage(policy: str) -> None:
    job = make_job(policy, queue="research")
    made = [
        builders.new_ssh_secret(job, KEYS, KEYS),
        builders.new_config_map(job),
        builders.new_worker_service(job),
        builders.new_pod_group(job, 0),
        builders.new_worker_pod(job, 0, 0, True),
        builders.new_launcher_job(job, 0),
        builders.new_workload(job, 0, None),
    ]
    for obj in made:
        row = kinds.of(obj["kind"], obj["apiVersion"])
        assert (row.kind, row.api_version) == (obj["kind"], obj["apiVersion"]), obj["kind"]
        assert row.create_stage is not None, row


def test_the_create_order_and_the_cleanup_of_an_invalid_job() -> None:
    # What the pods mount or wait for, then the pods, then the launcher that connects.
    assert kinds.CREATE_STAGES == (
        ("Workload", "Secret", "ConfigMap", "Service", "PodGroup"),
        ("Pod",),
        ("Job",),
    )
    assert kinds.DELETED_WHEN_INVALID == ("Secret", "ConfigMap", "Service")


def test_paths_of_namespaced_cluster_scoped_and_shared_kinds() -> None:
    assert kinds.collection_path("Pod", "a") == "/api/v1/namespaces/a/pods"
    assert kinds.collection_path("Job", "a") == "/apis/batch/v1/namespaces/a/jobs"
    assert (
        kinds.collection_path("HorovodJob", "a")
        == "/apis/horovod.ai/v1alpha1/namespaces/a/horovodjobs"
    )
    assert kinds.collection_path("ResourceFlavor", "a") == (
        "/apis/kueue.x-k8s.io/v1beta2/resourceflavors"
    )
    # A kind two groups name: by apiVersion, the first row without one.
    assert kinds.collection_path("PodGroup", "a") == (
        "/apis/scheduling.k8s.io/v1beta1/namespaces/a/podgroups"
    )
    assert kinds.collection_path("PodGroup", "a", "scheduling.volcano.sh/v1beta1") == (
        "/apis/scheduling.volcano.sh/v1beta1/namespaces/a/podgroups"
    )
    assert kinds.POD.collection() == "/api/v1/pods"  # every namespace: a watch's list


def test_every_watched_child_kind_has_a_sorting_rule_and_others_are_refused() -> None:
    # The indexes are keyed by kind name and handed to sort_children whole: a new
    # watched kind without a rule must fail loudly, not land among "foreign" objects.
    watched = [k for k in (*watches.ALWAYS, watches.WORKLOADS) if k is not watches.JOBS]
    owned = {"metadata": {"name": "x", "ownerReferences": [{"controller": True, "uid": "u"}]}}
    for kind in [*(k.kind for k in watched), kinds.SECRET.kind]:
        sort_children("u", {kind: [owned]})
    with pytest.raises(ValueError, match="no rule for the kinds \\['Lease'\\]"):
        sort_children("u", {kinds.LEASE.kind: [owned]})
