"""`kubectl get -o json`, answered over one keep-alive HTTPS connection per thread.

The tests poll the API server with `kubectl get` every 0.2 s while they wait, and each
call is a Go binary's start and a TLS handshake: about 60 ms of CPU. Process
accounting over a whole CI run counted 5,759 calls, 8 % of the two cores' CPU
(docs/dev/ci-times.md). A GET on a kept connection costs a few milliseconds.

Only what is certain is answered here: a resource name that discovery knows, read
with a plain GET that came back 200 or 404. Anything else (a kind kubectl spells
some other way, an error, a slow or stopped API server) returns None, and the
caller runs kubectl as before, so a failure reads exactly as it did.
"""

from __future__ import annotations

import http.client
import json
import threading
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from localcluster.kube import Client

# Short: past it kubectl answers (a test that hangs the API server waits for kubectl's
# own limit, as before, plus this).
TIMEOUT_S = 5.0


def _without_managed_fields(obj: Any) -> Any:
    """What kubectl prints: it drops metadata.managedFields unless asked for them."""
    obj.get("metadata", {}).pop("managedFields", None)
    return obj


@dataclass(frozen=True)
class Resource:
    prefix: str  # /api/v1 or /apis/GROUP/VERSION
    plural: str
    namespaced: bool
    api_version: str
    kind: str


class Reads:
    def __init__(self, kubeconfig: Path) -> None:
        self._kubeconfig = kubeconfig
        self._client: Client | None = None
        self._namespace = "default"
        self._resources: dict[str, Resource] = {}
        self._local = threading.local()
        self._lock = threading.Lock()

    def get(
        self,
        kind: str,
        name: str | None = None,
        namespace: str | None = None,
        selector: str | None = None,
    ) -> tuple[int, Any] | None:
        """(200, what `kubectl get KIND [NAME] -o json` prints) or (404, None) for a
        NAME that is not there; None when kubectl should answer instead."""
        try:
            resource = self._resource(kind)
            if resource is None:
                return None
            path = resource.prefix
            if resource.namespaced:
                path += f"/namespaces/{namespace or self._namespace}"
            path += f"/{resource.plural}"
            if name:
                path += f"/{urllib.parse.quote(name)}"
            elif selector:
                path += "?" + urllib.parse.urlencode({"labelSelector": selector})
            status, data = self._get(path)
        except (OSError, http.client.HTTPException, ValueError, KeyError):
            self._local.conn = None
            return None
        if status == 404 and name:
            return 404, None
        if status != 200:
            return None
        if name:
            return 200, _without_managed_fields(data)
        # kubectl prints a list as a List whose items carry their apiVersion and kind.
        items = [
            {"apiVersion": resource.api_version, "kind": resource.kind, **item}
            for item in map(_without_managed_fields, data.get("items") or [])
        ]
        return 200, {
            "apiVersion": "v1",
            "items": items,
            "kind": "List",
            "metadata": {"resourceVersion": ""},
        }

    def _get(self, path: str) -> tuple[int, Any]:
        conn: http.client.HTTPSConnection | None = getattr(self._local, "conn", None)
        client = self._connected()
        if conn is None:
            conn = http.client.HTTPSConnection(
                client.host, client.port, context=client.ssl, timeout=TIMEOUT_S
            )
            self._local.conn = conn
        headers = {"Accept": "application/json", "User-Agent": client.user_agent}
        if client.token:
            headers["Authorization"] = f"Bearer {client.token}"
        conn.request("GET", path, headers=headers)
        response = conn.getresponse()
        raw = response.read()
        return response.status, json.loads(raw) if response.status == 200 else None

    def _connected(self) -> Client:
        with self._lock:
            if self._client is None:
                self._client = Client(self._kubeconfig, user_agent="horovod-tests")
                config = yaml.safe_load(self._kubeconfig.read_text())
                current = config.get("current-context")
                for context in config.get("contexts") or []:
                    if context["name"] == current:
                        self._namespace = context["context"].get("namespace") or "default"
            return self._client

    def _resource(self, kind: str) -> Resource | None:
        """What a kubectl resource name stands for, from discovery; discovery again
        once for a name it did not know (a CRD installed since)."""
        if "/" in kind or "," in kind:
            return None
        key = kind.lower()
        if key not in self._resources:
            self._resources = self._discover()
        return self._resources.get(key)

    def _discover(self) -> dict[str, Resource]:
        table: dict[str, Resource] = {}
        status, core = self._get("/api/v1")
        if status != 200:
            raise ValueError(f"discovery of /api/v1: HTTP {status}")
        self._add(table, core, "/api/v1", "v1", "")
        status, groups = self._get("/apis")
        if status != 200:
            raise ValueError(f"discovery of /apis: HTTP {status}")
        for group in groups["groups"]:
            version = group["preferredVersion"]["groupVersion"]
            status, listed = self._get(f"/apis/{version}")
            if status == 200:
                self._add(table, listed, f"/apis/{version}", version, group["name"])
        return table

    @staticmethod
    def _add(
        table: dict[str, Resource], listed: Any, prefix: str, version: str, group: str
    ) -> None:
        for entry in listed.get("resources") or []:
            if "/" in entry["name"] or "get" not in entry.get("verbs", []):
                continue  # a subresource, or nothing kubectl get could read
            resource = Resource(
                prefix, entry["name"], bool(entry["namespaced"]), version, entry["kind"]
            )
            singular = entry.get("singularName") or entry["kind"].lower()
            for alias in {
                entry["name"],
                singular,
                entry["kind"].lower(),
                *entry.get("shortNames", []),
            }:
                # The core group and the groups listed first win, as in kubectl
                # (`events` is core/v1's, not events.k8s.io's).
                table.setdefault(alias, resource)
                if group:
                    table.setdefault(f"{alias}.{group}", resource)
