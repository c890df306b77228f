"""The few API calls the agent makes, as plain JSON over the kubernetes client's transport."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from kubernetes import client, config
from kubernetes.watch.watch import iter_resp_lines

Obj = dict[str, Any]


class KubeError(RuntimeError):
    def __init__(self, status: int, message: str):
        super().__init__(f"{status}: {message}")
        self.status = status


class Kube:
    def __init__(self, kubeconfig: str):
        cfg = client.Configuration()
        config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
        cfg.connection_pool_maxsize = 64
        self.api = client.ApiClient(cfg)
        self.server = cfg.host

    def _call(
        self,
        method: str,
        path: str,
        body: Obj | None,
        query: dict[str, str] | None,
        content_type: str,
        timeout: Any,
    ) -> Any:
        method, url, headers, payload, post = self.api.param_serialize(
            method=method,
            resource_path=path,
            query_params=list((query or {}).items()),
            header_params={"Content-Type": content_type, "Accept": "application/json"},
            body=body,
            auth_settings=["BearerToken"],
        )
        return self.api.call_api(method, url, headers, payload, post, _request_timeout=timeout)

    def request(
        self,
        method: str,
        path: str,
        body: Obj | None = None,
        query: dict[str, str] | None = None,
        content_type: str = "application/json",
        timeout: float = 30,
    ) -> Obj:
        response = self._call(method, path, body, query, content_type, timeout)
        raw = response.read()
        data: Obj = json.loads(raw) if raw else {}
        if not 200 <= response.status < 300:
            raise KubeError(response.status, str(data.get("message") or raw[:300]))
        return data

    def get(self, path: str) -> Obj | None:
        try:
            return self.request("GET", path)
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    def watch(self, path: str, query: dict[str, str]) -> Iterator[Obj]:
        """Events of one watch request; returns when the server closes it."""
        response = self._call(
            "GET", path, None, {**query, "watch": "true"}, "application/json", (10, 330)
        )
        if response.status != 200:
            raise KubeError(response.status, str(response.read()[:300]))
        raw = response.response  # the urllib3 response, not read yet: a stream
        try:
            for line in iter_resp_lines(raw):
                if line:
                    yield json.loads(line)
        finally:
            raw.release_conn()

    # -- pods
    def pod_path(self, namespace: str, name: str) -> str:
        return f"/api/v1/namespaces/{namespace}/pods/{name}"

    def patch_pod_status(self, namespace: str, name: str, status: Obj) -> None:
        self.request(
            "PATCH",
            self.pod_path(namespace, name) + "/status",
            {"status": status},
            content_type="application/strategic-merge-patch+json",
        )

    def delete_pod_now(self, namespace: str, name: str, uid: str) -> None:
        """The kubelet's final delete: grace 0, and only this very pod (uid precondition)."""
        try:
            self.request(
                "DELETE",
                self.pod_path(namespace, name),
                {"gracePeriodSeconds": 0, "preconditions": {"uid": uid}},
            )
        except KubeError as exc:
            if exc.status not in (404, 409):
                raise

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
        out = self.request(
            "POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token", body
        )
        return str(out["status"]["token"])

    # -- nodes and leases
    def apply_node(self, node: Obj) -> None:
        name = node["metadata"]["name"]
        if self.get(f"/api/v1/nodes/{name}") is None:
            self.request("POST", "/api/v1/nodes", node)
        else:
            self.request(
                "PATCH",
                f"/api/v1/nodes/{name}",
                {"metadata": node["metadata"], "spec": node["spec"]},
                content_type="application/merge-patch+json",
            )

    def patch_node_status(self, name: str, status: Obj) -> None:
        self.request(
            "PATCH",
            f"/api/v1/nodes/{name}/status",
            {"status": status},
            content_type="application/strategic-merge-patch+json",
        )

    def renew_lease(self, node: str, uid: str, renew_time: str) -> None:
        path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{node}"
        spec = {"holderIdentity": node, "leaseDurationSeconds": 40, "renewTime": renew_time}
        if self.get(path) is None:
            self.request(
                "POST",
                "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
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
            self.request("PATCH", path, {"spec": spec}, content_type="application/merge-patch+json")

    def delete(self, path: str) -> None:
        try:
            self.request("DELETE", path)
        except KubeError as exc:
            if exc.status != 404:
                raise
