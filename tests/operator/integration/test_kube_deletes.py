"""Deletes carry a UID precondition, against the real API server: an object of the
same name made meanwhile (a user re-applied the job, another attempt's pod) is not
the one the operator decided to delete, and stays."""

from __future__ import annotations

import asyncio
import json

from horovod_operator.kube import Kube
from tests.support.cluster import KubeCluster


def _config_map(cluster: KubeCluster, namespace: str, name: str) -> dict[str, object] | None:
    proc = cluster.kubectl("get", "configmap", name, "-n", namespace, "-o", "json", check=False)
    return json.loads(proc.stdout) if proc.returncode == 0 else None


def test_a_delete_of_a_replaced_object_keeps_the_new_one(
    cluster: KubeCluster, namespace: str
) -> None:
    manifest = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "same-name"}}
    cluster.apply({**manifest, "metadata": {"name": "same-name", "namespace": namespace}})
    old = _config_map(cluster, namespace, "same-name")
    assert old is not None
    old_uid = old["metadata"]["uid"]  # type: ignore[index]
    cluster.kubectl("delete", "configmap", "same-name", "-n", namespace)
    cluster.apply({**manifest, "metadata": {"name": "same-name", "namespace": namespace}})
    new = _config_map(cluster, namespace, "same-name")
    assert new is not None and new["metadata"]["uid"] != old_uid  # type: ignore[index]

    async def delete(uid: str) -> object:
        kube = Kube.from_kubeconfig(str(cluster.kubeconfig))
        try:
            return await kube.delete("ConfigMap", namespace, "same-name", uid=uid)
        finally:
            await kube.close()

    # The decision was about the old one: the server refuses (409), which is "gone".
    assert asyncio.run(delete(old_uid)) is None
    assert _config_map(cluster, namespace, "same-name") == new
    # The same delete with the current UID takes it.
    asyncio.run(delete(new["metadata"]["uid"]))  # type: ignore[index]
    assert _config_map(cluster, namespace, "same-name") is None
