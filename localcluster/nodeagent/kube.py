"""The API calls the agent makes, as a kubelet makes them, over localcluster.kube.Client."""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path
from typing import Any

from ..kube import ApiError, Client, with_query

# What every call here raises when the API server refuses it (`status`: the HTTP code).
__all__ = ["ApiError", "Kube"]

Obj = dict[str, Any]
USER_AGENT = "horovod-nodeagent"
LEASES = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"
# The API server ends a pod watch after this long; the agent then watches on from
# the last resourceVersion it saw.
WATCH_SECONDS = 300


class Kube:
    def __init__(self, kubeconfig: str | Path):
        self.client = Client(kubeconfig, user_agent=USER_AGENT)
        self.server = self.client.server

    def close(self) -> None:
        self.client.close()

    def get(self, path: str) -> Obj | None:
        return self.client.get(path)

    def delete(self, path: str) -> None:
        """Delete `path`; one that is gone already is no error."""
        self.client.delete(path)

    # -- pods
    @staticmethod
    def pod_path(namespace: str, name: str) -> str:
        return f"/api/v1/namespaces/{namespace}/pods/{name}"

    def list_pods(self, node: str) -> Obj:
        """The pods bound to `node`: a PodList, whose resourceVersion a watch resumes from."""
        return self.client.request("GET", with_query("/api/v1/pods", _bound_to(node)))[1]

    def watch_pods(self, node: str, resource_version: str) -> Generator[Obj, None, None]:
        """The events of one watch of the pods bound to `node`, bookmarks included.

        Returns when the server ends the watch; raises ApiError on an ERROR event
        (410 Gone: list again) and OSError/HTTPException on a broken connection.
        """
        return self.client.watch(
            "/api/v1/pods",
            resource_version,
            query=_bound_to(node),
            timeout_seconds=WATCH_SECONDS,
        )

    def patch_pod_status(self, namespace: str, name: str, status: Obj) -> None:
        self.client.strategic_merge_patch(
            self.pod_path(namespace, name) + "/status", {"status": status}
        )

    def delete_pod_now(self, namespace: str, name: str, uid: str) -> None:
        """The kubelet's final delete: grace 0, and only this very pod (uid precondition)."""
        self.client.request(
            "DELETE",
            self.pod_path(namespace, name),
            {"gracePeriodSeconds": 0, "preconditions": {"uid": uid}},
            ok=(404, 409),
        )

    def object_data(self, kind: str, namespace: str, name: str) -> Obj | None:
        plural = {"secretRef": "secrets", "configMapRef": "configmaps"}[kind]
        return self.get(f"/api/v1/namespaces/{namespace}/{plural}/{name}")

    def service_account_token(
        self, namespace: str, account: str, pod: Obj, audience: str | None, seconds: int
    ) -> str:
        body: Obj = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "expirationSeconds": seconds,
                "boundObjectRef": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": pod["metadata"]["name"],
                    "uid": pod["metadata"]["uid"],
                },
            },
        }
        if audience:
            body["spec"]["audiences"] = [audience]
        out = self.client.request(
            "POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token", body
        )[1]
        return str(out["status"]["token"])

    # -- nodes and leases
    def apply_node(self, node: Obj) -> str:
        """Create or update the Node; returns its uid (the owner of its Lease)."""
        name = node["metadata"]["name"]
        if self.get(f"/api/v1/nodes/{name}") is None:
            created = self.client.request("POST", "/api/v1/nodes", node)[1]
        else:
            created = self.client.merge_patch(
                f"/api/v1/nodes/{name}", {"metadata": node["metadata"], "spec": node["spec"]}
            )
        return str(created["metadata"]["uid"])

    def patch_node_status(self, name: str, status: Obj) -> None:
        self.client.strategic_merge_patch(f"/api/v1/nodes/{name}/status", {"status": status})

    def renew_lease(self, node: str, uid: str, renew_time: str) -> None:
        path = f"{LEASES}/{node}"
        spec = {"holderIdentity": node, "leaseDurationSeconds": 40, "renewTime": renew_time}
        if self.get(path) is None:
            self.client.request(
                "POST",
                LEASES,
                {
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": {
                        "name": node,
                        "namespace": "kube-node-lease",
                        "ownerReferences": [
                            {"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid}
                        ],
                    },
                    "spec": spec,
                },
            )
        else:
            self.client.merge_patch(path, {"spec": spec})

    def delete_node(self, name: str) -> None:
        """The node's Lease, then the Node."""
        self.delete(f"{LEASES}/{name}")
        self.delete(f"/api/v1/nodes/{name}")


def _bound_to(node: str) -> dict[str, str]:
    return {"fieldSelector": f"spec.nodeName={node}"}
