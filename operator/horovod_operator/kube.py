"""Every Kubernetes API call the reconciler makes, in one place.

A thin JSON client over aiohttp on the event loop (transport.py, shared with the
watches), without the kubernetes package's generated models (see connection.py).
Plain dicts go in and come out; no typed models, so what the builders produce is
exactly what is sent. JSON goes through pydantic_core's parser (here and in the
watches): 0.6 of the json module's time on a pod event, where decoding was 11 % of
the operator's CPU in a burst.

Deletes are delete-if-present (404 is success). A create that finds the name taken
raises the 409: only the caller can tell whether the object there is its own (see the
executor's ownership check). A token bucket caps requests per second (QPS with a
burst), like client-go's rate limiter, and every request has a connect and a read
timeout, so a half-open connection cannot stop the reconciler.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, Final
from urllib.parse import urlencode

import aiohttp
from pydantic_core import from_json, to_json

from . import transport
from .api import GROUP, VERSION
from .connection import Connection, load_connection
from .kinds import collection_path
from .kube_errors import KubeError, NotLeader
from .rate_limit import DIAGNOSTIC_BURST, DIAGNOSTIC_QPS, RateLimiter

logger = logging.getLogger(__name__)

Obj = dict[str, Any]

FIELD_MANAGER: Final = transport.USER_AGENT
# (connect, read) seconds of every request.
REQUEST_TIMEOUT: Final = (10.0, 60.0)
# Tries again of a request whose connection failed before an answer came, as
# urllib3 (the kubernetes package's HTTP library) does by default.
RETRIES: Final = 3


class Kube:
    """The operator's API client. One per process, used from its event loop."""

    def __init__(
        self,
        connection: Connection,
        qps: float = 50.0,
        burst: int = 100,
        connections: int = 16,
        timeout: tuple[float, float] = REQUEST_TIMEOUT,
        retries: int = RETRIES,
        user_agent: str = FIELD_MANAGER,
        may_write: Callable[[], bool] | None = None,
        on_request: Callable[[str, str], None] | None = None,
    ) -> None:
        """`connections`: requests in flight at once. `timeout` (connect, read) and
        `retries` per request: the leader elector's client allows no call longer
        than its renew deadline and retries nothing. `may_write`: whether a write
        may be sent now (leader election's fence: LeaderElector.holds), asked the
        moment before each write goes out. `on_request(verb, kind)`: counts for
        metrics and the write-count benchmark."""
        self.connection = connection
        # Starts with the field manager (what audit counts match on); a replica adds
        # its identity, so the API server's audit log tells replicas apart.
        self.user_agent = user_agent
        self._sessions = transport.Sessions(connection, in_flight=connections)
        self._timeout = aiohttp.ClientTimeout(sock_connect=timeout[0], sock_read=timeout[1])
        self._retries = retries
        self._limiter = RateLimiter(qps, burst)
        # The HorovodJobs' own reads and writes have a bucket of their own with the same
        # QPS and burst, as a CRD's generated clientset has in client-go beside the core
        # clientset's (mpi-operator's MPIJob status writes do): a job's Running write
        # does not queue behind a burst of other jobs' pod creates.
        self._jobs = RateLimiter(qps, burst)
        # Reads that only describe a job (rank 0's log for the time to first step) have a
        # small budget of their own: in a burst of new jobs they would otherwise take the
        # tokens the jobs' creates wait for (about 3 per job in the 100-job benchmark).
        self._diagnostics = RateLimiter(
            min(qps, DIAGNOSTIC_QPS) if qps > 0 else 0, min(burst, DIAGNOSTIC_BURST)
        )
        self.on_request: Callable[[str, str], None] = on_request or (lambda verb, kind: None)
        self.may_write: Callable[[], bool] = may_write or (lambda: True)

    @classmethod
    def from_kubeconfig(cls, kubeconfig: str | None, **options: Any) -> Kube:
        return cls(load_connection(kubeconfig), **options)

    async def close(self) -> None:
        await self._sessions.close()

    async def _send(
        self,
        verb: str,
        path: str,
        body: Any,
        query: Mapping[str, str] | None,
        content_type: str,
    ) -> tuple[int, str, bytes]:
        """(status code, reason, raw body) of one request."""
        url = self.connection.server + path
        if query:
            url += "?" + urlencode(query)
        payload = None if body is None else to_json(body)
        lane = self._sessions.get()
        async with lane.slots:
            for attempt in range(self._retries + 1):
                # The fence, after every wait of ours: nothing queues between it and
                # the send but the connection itself.
                if verb not in ("GET", "HEAD") and not self.may_write():
                    raise NotLeader(
                        f"{verb} {path}: this replica does not hold the leader Lease now"
                    )
                headers = transport.headers(self.connection, self.user_agent, content_type)
                try:
                    async with lane.session.request(
                        verb, url, data=payload, headers=headers, timeout=self._timeout
                    ) as response:
                        return response.status, str(response.reason or ""), await response.read()
                except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as error:
                    # A read that timed out is not tried again (it may have been done).
                    if isinstance(error, TimeoutError) or attempt == self._retries:
                        raise
                    logger.debug("%s %s: %s; trying again", verb, path, error)
        raise AssertionError("unreachable")

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
        decode: bool = True,
    ) -> Obj:
        await (limiter or self._limiter).acquire()
        self.on_request(counted_as or verb, kind)
        status, reason, raw = await self._send(verb, path, body, query, content_type)
        if not 200 <= status < 300:
            raise transport.refusal(status, reason, raw)
        data: Obj = from_json(raw) if raw and decode else {}
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
        status, reason, raw = await self._send("GET", path, None, query, "application/json")
        if not 200 <= status < 300:
            raise transport.refusal(status, reason, raw)
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
        limiter: RateLimiter | None = None,
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
            return await self._request("DELETE", kind, path, body=body, limiter=limiter)
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
        want_names: bool = True,
    ) -> list[str]:
        """Delete every `kind` (of `api_version` where two groups share the kind) in
        `namespace` the selectors match, in one request; the names of those deleted
        (none read when not `want_names`: the answer holds every deleted object whole,
        and decoding 512 pods was 6 % of the operator's CPU in a 512-worker job).
        Needs RBAC's deletecollection verb."""
        query = {"labelSelector": label_selector}
        if field_selector:
            query["fieldSelector"] = field_selector
        body: Obj = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}
        path = collection_path(kind, namespace, api_version)
        listed = await self._request(
            "DELETE",
            kind,
            path,
            body=body,
            query=query,
            counted_as="DELETECOLLECTION",
            decode=want_names,
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
            return await self._request("GET", "HorovodJob", path, limiter=self._jobs)
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
            limiter=self._jobs,
        )

    async def delete_job(self, namespace: str, name: str, uid: str) -> None:
        """The HorovodJob with `uid` (its TTL passed); a re-applied one of the same
        name is another job and is kept."""
        await self.delete("HorovodJob", namespace, name, uid=uid, limiter=self._jobs)

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
