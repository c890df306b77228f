"""The operator's own list-then-watch against the real API server: what it keeps,
and what it forgets. (This API server cannot be made to expire a watch, 410 Gone:
it answers an old resourceVersion from its watch cache or from etcd, compacted or
not; tests/operator/test_watch_protocol.py feeds the watch that answer.)"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable

import pytest

from horovod_operator import watches
from horovod_operator.connection import load_connection
from horovod_operator.memory import Key
from tests.support.aio import wait_for
from tests.support.cluster import KubeCluster

MANAGED = {"app.kubernetes.io/managed-by": "horovod-operator"}


def config_map(name: str, job: str | None, managed: bool = True) -> str:
    labels = dict(MANAGED) if managed else {}
    if job:
        labels["horovod.ai/job-name"] = job
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, "labels": labels},
            "data": {"hostfile": f"{name} slots=1"},
        }
    )


async def watched(
    cluster: KubeCluster, namespace: str, steps: Callable[[watches.Watches, list[Key]], object]
) -> None:
    changes: list[Key] = []
    synced = asyncio.Event()
    watching = watches.Watches(
        load_connection(str(cluster.kubeconfig)),
        [watches.CONFIG_MAPS],
        [namespace],
        on_change=changes.append,
        on_synced=synced.set,
    )
    watching.start()
    try:
        await asyncio.wait_for(synced.wait(), 30)
        await steps(watching, changes)  # type: ignore[misc]
    finally:
        await watching.close()


def apply(cluster: KubeCluster, namespace: str, manifest: str) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=manifest)


def test_it_lists_watches_moves_and_forgets(cluster: KubeCluster, namespace: str) -> None:
    # Present before the watch starts: listed. Unmanaged: never seen.
    apply(cluster, namespace, config_map("a-config", "a"))
    apply(cluster, namespace, config_map("stranger", "a", managed=False))

    async def steps(watching: watches.Watches, changes: list[Key]) -> None:
        store = watching.stores["ConfigMap"]
        assert [o["metadata"]["name"] for o in store[(namespace, "a")]] == ["a-config"]
        assert next(iter(store[(namespace, "a")]))["kind"] == "ConfigMap"  # lists omit it
        assert changes == [(namespace, "a")]
        # Created while watching.
        await asyncio.to_thread(apply, cluster, namespace, config_map("b-config", "b"))
        await wait_for(lambda: (namespace, "b") in store, 20, "b-config never seen")
        # Relabelled to another job: moves, and both jobs hear of it.
        changes.clear()
        await asyncio.to_thread(apply, cluster, namespace, config_map("b-config", "c"))
        await wait_for(lambda: (namespace, "c") in store, 20, "b-config never moved to c")
        assert (namespace, "b") not in store
        assert {(namespace, "b"), (namespace, "c")} <= set(changes)
        # Deleted: forgotten.
        await asyncio.to_thread(cluster.kubectl, "delete", "configmap", "-n", namespace, "a-config")
        await wait_for(lambda: (namespace, "a") not in store, 20, "a-config never forgotten")

    asyncio.run(watched(cluster, namespace, steps))


def test_a_fresh_list_forgets_what_went_while_nobody_watched(
    cluster: KubeCluster, namespace: str
) -> None:
    apply(cluster, namespace, config_map("a-config", "a"))

    async def steps(watching: watches.Watches, changes: list[Key]) -> None:
        store = watching.stores["ConfigMap"]
        assert (namespace, "a") in store
        # Nobody watches (as after a 410); meanwhile one object goes and another
        # comes. A fresh list replaces what was kept.
        for task in watching._tasks:
            task.cancel()
        await asyncio.gather(*watching._tasks, return_exceptions=True)
        await asyncio.to_thread(cluster.kubectl, "delete", "configmap", "-n", namespace, "a-config")
        await asyncio.to_thread(apply, cluster, namespace, config_map("d-config", "d"))
        changes.clear()
        await watching._list(watches.CONFIG_MAPS, namespace)
        assert (namespace, "a") not in store and (namespace, "d") in store
        assert {(namespace, "a"), (namespace, "d")} <= set(changes)

    asyncio.run(watched(cluster, namespace, steps))


def test_an_api_server_that_refuses_is_retried(
    cluster: KubeCluster, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A watch of a kind nobody serves fails with the server's answer and is retried
    (asked again after its backoff), never reported as synced and never crashing
    the operator."""
    bogus = watches.Kind("Nothing", "example.com/v1", "nothings", dict)
    synced = asyncio.Event()
    caplog.set_level(logging.WARNING, logger=watches.__name__)

    def failures() -> list[str]:
        return [r.getMessage() for r in caplog.records if "watch of " in r.getMessage()]

    async def run() -> None:
        watching = watches.Watches(
            load_connection(str(cluster.kubeconfig)),
            [bogus],
            [namespace],
            on_change=lambda key: None,
            on_synced=synced.set,
        )
        watching.start()
        # Two refusals: the first, and the same request again after its backoff (1 s).
        await wait_for(lambda: len(failures()) >= 2, 15, "the refused watch asked again")
        assert all("404" in message or "not found" in message.lower() for message in failures())
        assert not synced.is_set()
        assert all(not task.done() for task in watching._tasks)
        await watching.close()

    asyncio.run(run())


def pod(name: str, job: str, role: str) -> str:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "labels": {**MANAGED, "horovod.ai/job-name": job, "horovod.ai/role": role},
            },
            "spec": {
                "automountServiceAccountToken": False,
                "containers": [{"name": "c", "image": "never-pulled"}],
                # Never scheduled: no node is called this, and the pods stay Pending.
                "nodeSelector": {"horovod.ai/test": "nowhere"},
            },
        }
    )


def test_a_launcher_pods_changes_are_urgent_and_a_workers_are_not(
    cluster: KubeCluster, namespace: str
) -> None:
    """Watches' on_urgent (the reconciler's hurry, which skips its batch window) hears
    of the launcher's pod, created or changed, and never of a worker's."""
    urgent: list[Key] = []
    changes: list[Key] = []

    async def run() -> None:
        synced = asyncio.Event()
        watching = watches.Watches(
            load_connection(str(cluster.kubeconfig)),
            [watches.PODS],
            [namespace],
            on_change=changes.append,
            on_synced=synced.set,
            on_urgent=urgent.append,
        )
        watching.start()
        try:
            await asyncio.wait_for(synced.wait(), 30)
            store = watching.stores["Pod"]
            await asyncio.to_thread(apply, cluster, namespace, pod("w-worker-0", "w", "worker"))
            await wait_for(lambda: (namespace, "w") in store, 20, "the worker pod never seen")
            await asyncio.to_thread(apply, cluster, namespace, pod("l-launcher", "l", "launcher"))
            await wait_for(lambda: (namespace, "l") in urgent, 20, "the launcher pod not urgent")
            await asyncio.to_thread(
                cluster.kubectl, "label", "pod", "-n", namespace, "w-worker-0", "x=1"
            )
            await asyncio.to_thread(
                cluster.kubectl, "label", "pod", "-n", namespace, "l-launcher", "x=1"
            )
            await wait_for(lambda: urgent.count((namespace, "l")) >= 2, 20, "no second event")
            assert (namespace, "w") in changes
            assert (namespace, "w") not in urgent
        finally:
            await watching.close()

    asyncio.run(run())
