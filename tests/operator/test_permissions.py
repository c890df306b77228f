"""The operator's declared API rights (permissions.py) against what it watches:
list and watch only for the kinds watches.py watches, never for Secrets."""

from __future__ import annotations

from horovod_operator import permissions, watches


def _resource(kind: watches.Kind) -> str:
    group = kind.api_version.rpartition("/")[0]
    return f"{kind.plural}.{group}" if group else kind.plural


def test_list_and_watch_are_granted_for_exactly_the_watched_kinds() -> None:
    rights = {**permissions.namespaced(), **permissions.CLUSTER}
    watched = {_resource(k) for k in (*watches.ALWAYS, watches.WORKLOADS)}
    watching = {r for r, verbs in rights.items() if "watch" in verbs}
    assert watching == watched
    for resource in watched:
        assert {"list", "watch"} <= rights[resource], resource
    # The one list without a watch: the Warning Events of pods slow to start.
    assert {r for r, v in rights.items() if "list" in v} - watched == {"events"}


def test_no_secret_is_listed_or_watched_and_cluster_reads_are_gets() -> None:
    assert permissions.NAMESPACED["secrets"] == {"get", "create", "delete"}
    assert all(verbs == {"get"} for verbs in permissions.CLUSTER.values())
    assert "pods/log" not in permissions.namespaced(first_step=False)
    assert permissions.namespaced()["pods/log"] == {"get"}
