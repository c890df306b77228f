"""Every Kubernetes API call the reconciler makes, in one place.

A thin JSON client over urllib3 (the HTTP library the kubernetes package uses, without
that package's generated models: see connection.py), run in a thread pool so the kopf
event loop never blocks. Plain dicts go in and come out; no typed models, so what the
builders produce is exactly what is sent. JSON goes through pydantic_core's parser (here
and in the watches): 0.6 of the json module's time on a pod event, where decoding was
11 % of the operator's CPU in a burst.

Deletes are delete-if-present (404 is success). A create that finds the name taken
raises the 409: only the caller can tell whether the object there is its own (see the
executor's ownership check). A token bucket caps requests per second (QPS with a
burst), like client-go's rate limiter, and every request has a connect and a read
timeout, so a half-open connection cannot stop the reconciler.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final
from urllib.parse import urlencode

import urllib3
from pydantic_core import from_json, to_json

from .api import GROUP, VERSION
from .connection import Connection, load_connection
from .kinds import collection_path
from .kube_errors import KubeError, NotLeader
from .rate_limit import DIAGNOSTIC_BURST, DIAGNOSTIC_QPS, RateLimiter

logger = logging.getLogger(__name__)

Obj = dict[str, Any]

FIELD_MANAGER: Final = "horovod-operator"
# (connect, read) seconds of every request.
REQUEST_TIMEOUT: Final = (10.0, 60.0)


class Kube:
    """The operator's API client. One per process; thread-safe."""

    def __init__(
        self,
        connection: Connection,
        qps: float = 50.0,
        burst: int = 100,
        threads: int = 16,
        timeout: tuple[float, float] = REQUEST_TIMEOUT,
        retries: bool | int | None = None,
        user_agent: str = FIELD_MANAGER,
    ) -> None:
        """`timeout` (connect, read) and `retries` (urllib3's; None: its default of
        3 on connection errors) per request: the leader elector's client allows
        no call longer than its renew deadline and retries nothing."""
        self.connection = connection
        # Starts with the field manager (what audit counts match on); a replica adds
        # its identity, so the API server's audit log tells replicas apart.
        self.user_agent = user_agent
        tls: dict[str, Any] = {}
        if connection.server.startswith("https:"):
            tls = {
                "cert_reqs": "CERT_NONE" if connection.insecure else "CERT_REQUIRED",
                "ca_certs": connection.ca_file,
                "cert_file": connection.cert_file,
                "key_file": connection.key_file,
            }
            if connection.insecure:
                urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
        # urllib3's default retries (3, connection errors) as the kubernetes package had.
        pool_options: dict[str, Any] = {} if retries is None else {"retries": retries}
        self._pool = urllib3.PoolManager(
            maxsize=threads,
            timeout=urllib3.Timeout(connect=timeout[0], read=timeout[1]),
            **pool_options,
            **tls,
        )
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="kube")
        self._limiter = RateLimiter(qps, burst)
        # Reads that only describe a job (rank 0's log for the time to first step) have a
        # small budget of their own: in a burst of new jobs they would otherwise take the
        # tokens the jobs' creates wait for (about 3 per job in the 100-job benchmark).
        self._diagnostics = RateLimiter(
            min(qps, DIAGNOSTIC_QPS) if qps > 0 else 0, min(burst, DIAGNOSTIC_BURST)
        )
        # Counts of requests by verb and kind, for metrics and the write-count benchmark.
        self.on_request: Callable[[str, str], None] = lambda verb, kind: None
        # Whether a write may be sent now (leader election's fence: LeaderElector.holds);
        # asked in the request's own thread, the last moment before it is sent.
        self.may_write: Callable[[], bool] = lambda: True

    @classmethod
    def from_kubeconfig(cls, kubeconfig: str | None, **options: Any) -> Kube:
        return cls(load_connection(kubeconfig), **options)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._pool.clear()

    async def _request(
        self,
        verb: str,
        kind: str,
        path: str,
        body: Any = None,
        query: Mapping[str, str] | None = None,
        content_type: str = "application/json",
        counted_as: str | None = None,
        limiter: RateLimiter | None = None,
    ) -> Obj:
        await (limiter or self._limiter).acquire()
        self.on_request(counted_as or verb, kind)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._executor, self._request_sync, verb, path, body, query, content_type
        )

    def _call_sync(
        self,
        verb: str,
        path: str,
        body: Any,
        query: Mapping[str, str] | None,
        content_type: str,
    ) -> tuple[int, str, bytes]:
        """(status code, reason, raw body) of one request."""
        if verb not in ("GET", "HEAD") and not self.may_write():
            raise NotLeader(f"{verb} {path}: this replica does not hold the leader Lease now")
        headers = {
            "Accept": "application/json",
            "Content-Type": content_type,
            "User-Agent": self.user_agent,
        }
        authorization = self.connection.authorization()
        if authorization:
            headers["Authorization"] = authorization
        url = self.connection.server + path
        if query:
            url += "?" + urlencode(query)
        payload = None if body is None else to_json(body)
        response = self._pool.request(verb, url, body=payload, headers=headers)
        return response.status, str(response.reason), response.data

    def _request_sync(
        self,
        verb: str,
        path: str,
        body: Any,
        query: Mapping[str, str] | None,
        content_type: str,
    ) -> Obj:
        status, reason, raw = self._call_sync(verb, path, body, query, content_type)
        ok = 200 <= status < 300
        try:
            data: Obj = from_json(raw) if raw else {}
        except ValueError:
            if ok:
                raise
            data = {}  # not a Status: "404 page not found" for a group nobody serves
        if not ok:
            raise KubeError(
                status,
                str(data.get("reason") or reason),
                str(data.get("message") or raw[:500]),
            )
        return data

    async def pod_log(
        self,
        namespace: str,
        pod: str,
        container: str | None,
        limit_bytes: int,
        since_time: str | None = None,
    ) -> str:
        """The first `limit_bytes` of a container's log (from `since_time` on, RFC 3339
        in whole seconds, when given), each line led by its timestamp (RFC 3339) where
        the kubelet has one."""
        query = {"limitBytes": str(limit_bytes), "timestamps": "true"}
        if container:
            query["container"] = container
        if since_time:
            query["sinceTime"] = since_time
        path = f"/api/v1/namespaces/{namespace}/pods/{pod}/log"
        await self._diagnostics.acquire()
        self.on_request("GET", "PodLog")
        loop = asyncio.get_running_loop()
        status, reason, raw = await loop.run_in_executor(
            self._executor, self._call_sync, "GET", path, None, query, "application/json"
        )
        if not 200 <= status < 300:
            try:
                data = from_json(raw)
            except ValueError:
                data = {}
            raise KubeError(
                status, str(data.get("reason") or reason), str(data.get("message") or raw[:500])
            )
        return raw.decode(errors="replace")

    async def serves(self, group_version: str, plural: str) -> bool:
        """Whether the API server serves `plural` in `group_version` (discovery)."""
        try:
            data = await self._request("GET", "Discovery", f"/apis/{group_version}")
        except KubeError as error:
            if error.not_found:
                return False
            raise
        return any(r.get("name") == plural for r in data.get("resources") or [])

    # --- children ------------------------------------------------------------------------

    async def create(self, obj: Obj) -> Obj:
        """Create `obj`; raises KubeError (409 when the name is taken)."""
        kind = obj["kind"]
        path = collection_path(kind, obj["metadata"]["namespace"], str(obj.get("apiVersion") or ""))
        return await self._request(
            "POST", kind, path, body=obj, query={"fieldManager": FIELD_MANAGER}
        )

    async def list_events(self, namespace: str, field_selector: str) -> list[Obj]:
        """core/v1 Events in `namespace` matching a field selector: a diagnosis, on the
        diagnostics budget (never a token a create waits for), served from the API
        server's watch cache (resourceVersion 0: a second's staleness is fine here)."""
        path = collection_path("Event", namespace)
        query = {"fieldSelector": field_selector, "resourceVersion": "0"}
        data = await self._request(
            "GET", "Event", path, query=query, counted_as="LIST", limiter=self._diagnostics
        )
        items: list[Obj] = data.get("items") or []
        return items

    async def get(self, kind: str, namespace: str, name: str, api_version: str = "") -> Obj | None:
        path = collection_path(kind, namespace, api_version) + f"/{name}"
        try:
            return await self._request("GET", kind, path)
        except KubeError as error:
            if error.not_found:
                return None
            raise

    async def replace(self, obj: Obj) -> Obj:
        """PUT `obj`, conditional on its metadata.resourceVersion (409 if it moved)."""
        meta = obj["metadata"]
        path = collection_path(obj["kind"], meta["namespace"]) + f"/{meta['name']}"
        return await self._request(
            "PUT", obj["kind"], path, body=obj, query={"fieldManager": FIELD_MANAGER}
        )

    async def merge_patch(
        self, kind: str, namespace: str, name: str, patch: Obj, subresource: str = ""
    ) -> Obj:
        path = collection_path(kind, namespace) + f"/{name}"
        if subresource:
            path += f"/{subresource}"
        return await self._request(
            "PATCH",
            kind,
            path,
            body=patch,
            query={"fieldManager": FIELD_MANAGER},
            content_type="application/merge-patch+json",
        )

    async def delete(
        self,
        kind: str,
        namespace: str,
        name: str,
        propagation: str = "Background",
        grace_period: int | None = None,
        uid: str = "",
    ) -> Obj | None:
        """Delete an object; None when it is already gone (404 counts as success).

        grace_period 0 removes a pod at once, without its kubelet's confirmation
        (what `kubectl delete --force` does for a pod on a lost node). With `uid`,
        only that object: another of the same name (re-created meanwhile) answers
        409 and is kept, which counts as gone too."""
        path = collection_path(kind, namespace) + f"/{name}"
        body: Obj = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": propagation}
        if grace_period is not None:
            body["gracePeriodSeconds"] = grace_period
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            return await self._request("DELETE", kind, path, body=body)
        except KubeError as error:
            if error.not_found or (uid and error.conflict):
                return None
            raise

    async def delete_collection(
        self,
        kind: str,
        namespace: str,
        label_selector: str,
        field_selector: str = "",
        api_version: str = "",
    ) -> list[str]:
        """Delete every `kind` (of `api_version` where two groups share the kind) in
        `namespace` the selectors match, in one request; the names of those deleted.
        Needs RBAC's deletecollection verb."""
        query = {"labelSelector": label_selector}
        if field_selector:
            query["fieldSelector"] = field_selector
        body: Obj = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}
        path = collection_path(kind, namespace, api_version)
        listed = await self._request(
            "DELETE", kind, path, body=body, query=query, counted_as="DELETECOLLECTION"
        )
        return [str((item.get("metadata") or {}).get("name")) for item in listed.get("items") or ()]

    async def patch_status(
        self, kind: str, namespace: str, name: str, resource_version: str | None, status: Obj
    ) -> Obj:
        """Merge-patch another object's status subresource (a Kueue Workload's),
        conditional on resourceVersion: a status Kueue moved meanwhile is a 409."""
        patch: Obj = {"status": status}
        if resource_version:
            patch["metadata"] = {"resourceVersion": resource_version}
        return await self.merge_patch(kind, namespace, name, patch, subresource="status")

    # --- the HorovodJob ------------------------------------------------------------------

    async def get_job(self, namespace: str, name: str) -> Obj | None:
        path = collection_path("HorovodJob", namespace) + f"/{name}"
        try:
            return await self._request("GET", "HorovodJob", path)
        except KubeError as error:
            if error.not_found:
                return None
            raise

    async def patch_job_status(
        self, namespace: str, name: str, resource_version: str | None, status: Obj
    ) -> Obj:
        """Merge-patch the status subresource, conditional on resourceVersion.

        The precondition turns a status computed from a stale body into a 409
        conflict instead of a lost update (for example a restart counted twice).
        """
        path = collection_path("HorovodJob", namespace) + f"/{name}/status"
        patch: Obj = {"status": status}
        if resource_version is not None:
            patch["metadata"] = {"resourceVersion": resource_version}
        return await self._request(
            "PATCH",
            "HorovodJob",
            path,
            body=patch,
            query={"fieldManager": FIELD_MANAGER},
            content_type="application/merge-patch+json",
        )

    async def delete_job(self, namespace: str, name: str, uid: str) -> None:
        """The HorovodJob with `uid` (its TTL passed); a re-applied one of the same
        name is another job and is kept."""
        await self.delete("HorovodJob", namespace, name, uid=uid)

    async def post_event(
        self,
        job: Mapping[str, Any],
        type_: str,
        reason: str,
        message: str,
        now: str,
    ) -> None:
        """A core/v1 Event on the HorovodJob (kubectl describe shows it)."""
        meta = job["metadata"]
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": job.get("apiVersion", f"{GROUP}/{VERSION}"),
                "kind": job.get("kind", "HorovodJob"),
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta.get("uid"),
                "resourceVersion": meta.get("resourceVersion"),
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": FIELD_MANAGER},
            "reportingComponent": FIELD_MANAGER,
            "reportingInstance": FIELD_MANAGER,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await self.create(event)
        except KubeError as error:  # an Event is best effort; the status carries the truth
            logger.warning("could not post event %s on %s: %s", reason, meta["name"], error)
