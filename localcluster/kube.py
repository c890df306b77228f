"""A small, fast Kubernetes client: JSON over http.client (standard library + PyYAML).

The harness must not be the bottleneck it measures: on a 2-core machine the
typed kubernetes client spends more CPU deserializing 512-pod watches than the
operators under test. This one speaks JSON over http.client with the
kubeconfig's client certificate, one keep-alive connection per thread, and
streams watches line by line. bench/ and the node agent
(localcluster.nodeagent.kube) both use it.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import ssl
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable, Generator, Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

Obj = dict[str, Any]
USER_AGENT = "horovod-bench"
RETRY_STATUSES = (429, 500, 503, 504)


def _decode(raw: bytes) -> Obj:
    """A response body: JSON, or (a 404 for an unserved resource is text/plain, "404
    page not found") the text as a Status-like message, so the caller sees the code."""
    if not raw:
        return {}
    try:
        data: Obj = json.loads(raw)
    except ValueError:
        return {"message": raw.decode(errors="replace")[:2000]}
    return data


class ApiError(RuntimeError):
    def __init__(self, status: int, body: str, what: str) -> None:
        super().__init__(f"{what}: HTTP {status}: {body[:300]}")
        self.status = status


def with_query(path: str, query: Mapping[str, str]) -> str:
    """`path` with `query` URL-encoded onto it (after any query it has)."""
    if not query:
        return path
    return f"{path}{'&' if '?' in path else '?'}{urllib.parse.urlencode(query)}"


def _materialize(entry: dict[str, Any], key: str, tmp: Path, base: Path) -> str | None:
    """A kubeconfig field as a file path (inline *-data fields are written out).

    A relative path is relative to the kubeconfig's directory, as kubectl reads it.
    """
    if entry.get(key):
        return str(base / Path(entry[key]).expanduser())
    data = entry.get(f"{key}-data")
    if not data:
        return None
    path = tmp / key
    path.write_bytes(base64.b64decode(data))
    return str(path)


class Client:
    def __init__(self, kubeconfig: str | Path, user_agent: str = USER_AGENT) -> None:
        base = Path(kubeconfig).resolve().parent
        cfg = yaml.safe_load(Path(kubeconfig).read_text())
        ctx_name = cfg.get("current-context")
        ctx = next(c["context"] for c in cfg["contexts"] if c["name"] == ctx_name)
        cluster = next(c["cluster"] for c in cfg["clusters"] if c["name"] == ctx["cluster"])
        user = next(u["user"] for u in cfg["users"] if u["name"] == ctx["user"])
        self._tmp = tempfile.TemporaryDirectory(prefix="kube-client-")
        tmp = Path(self._tmp.name)
        self.server: str = cluster["server"]
        url = urllib.parse.urlparse(self.server)
        self.host = url.hostname or "127.0.0.1"
        self.port = url.port or 443
        ca = _materialize(cluster, "certificate-authority", tmp, base)
        self.ssl = ssl.create_default_context(cafile=ca)
        cert = _materialize(user, "client-certificate", tmp, base)
        key = _materialize(user, "client-key", tmp, base)
        if cert and key:
            self.ssl.load_cert_chain(cert, key)
        self.token = user.get("token")
        self.user_agent = user_agent
        self._local = threading.local()

    # --- plain requests -------------------------------------------------------------------

    def _conn(self, fresh: bool = False) -> http.client.HTTPSConnection:
        conn: http.client.HTTPSConnection | None = getattr(self._local, "conn", None)
        if conn is None or fresh:
            if conn is not None:
                conn.close()
            conn = http.client.HTTPSConnection(self.host, self.port, context=self.ssl, timeout=60)
            self._local.conn = conn
        return conn

    def _headers(self, content_type: str | None = None) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": self.user_agent}
        if content_type:
            headers["Content-Type"] = content_type
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        return headers

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
        ok: tuple[int, ...] = (),
    ) -> tuple[int, Obj]:
        payload = None if body is None else json.dumps(body).encode()
        for attempt in range(3):
            conn = self._conn(fresh=attempt > 0)
            try:
                conn.request(method, path, payload, self._headers(content_type if body else None))
                resp = conn.getresponse()
                raw = resp.read()
            except (OSError, http.client.HTTPException):
                if attempt == 2:
                    raise
                time.sleep(0.2)
                continue
            data = _decode(raw)
            if 200 <= resp.status < 300 or resp.status in ok:
                return resp.status, data
            if resp.status in RETRY_STATUSES and attempt < 2:
                # A CRD just established answers 429 "storage is (re)initializing" for a moment.
                time.sleep(1.0)
                continue
            raise ApiError(resp.status, raw.decode(errors="replace"), f"{method} {path}")
        raise AssertionError("unreachable")

    def get(self, path: str) -> Obj | None:
        status, data = self.request("GET", path, ok=(404,))
        return None if status == 404 else data

    def create(self, path: str, obj: Obj) -> Obj:
        return self.request("POST", path, obj, ok=(409,))[1]

    def merge_patch(self, path: str, patch: Obj) -> Obj:
        return self.request("PATCH", path, patch, "application/merge-patch+json")[1]

    def strategic_merge_patch(self, path: str, patch: Obj) -> Obj:
        """A strategic merge patch: lists merge by their key (conditions by type)."""
        return self.request("PATCH", path, patch, "application/strategic-merge-patch+json")[1]

    def apply(self, path: str, obj: Obj, manager: str = "horovod-bench") -> Obj:
        return self.request(
            "PATCH",
            f"{path}?fieldManager={manager}&force=true",
            obj,
            "application/apply-patch+yaml",
        )[1]

    def delete(self, path: str) -> None:
        self.request("DELETE", path, ok=(404,))

    # --- watches --------------------------------------------------------------------------

    def watch(
        self,
        path: str,
        resource_version: str,
        query: Mapping[str, str] | None = None,
        timeout_seconds: int = 300,
    ) -> Generator[Obj, None, None]:
        """The events of one watch request on `path` (a list URL) from `resource_version`.

        Bookmarks are yielded too: their resourceVersion is where to resume. Returns
        when the server ends the watch (after `timeout_seconds`). An ERROR event (410
        Gone: the version is too old to resume from; list again) raises ApiError with
        its code; a broken connection raises OSError or http.client.HTTPException
        (resume from the last version seen).
        """
        params = {
            **(query or {}),
            "watch": "1",
            "allowWatchBookmarks": "true",
            "resourceVersion": resource_version,
            "timeoutSeconds": str(timeout_seconds),
        }
        # A connection of its own (the response streams until the server ends it), with a
        # read timeout past the server's: a watch that went silent is a broken one.
        conn = http.client.HTTPSConnection(
            self.host, self.port, context=self.ssl, timeout=timeout_seconds + 60
        )
        try:
            conn.request("GET", with_query(path, params), headers=self._headers())
            resp = conn.getresponse()
            if resp.status != 200:
                raise ApiError(resp.status, resp.read().decode(errors="replace"), f"watch {path}")
            while True:
                line = resp.readline()
                if not line:
                    return
                if not line.strip():
                    continue
                event: Obj = json.loads(line)
                if event.get("type") == "ERROR":
                    code = (event.get("object") or {}).get("code") or 410
                    raise ApiError(int(code), json.dumps(event), f"watch {path}")
                yield event
        finally:
            conn.close()

    def stream(self, path: str, stop: threading.Event) -> Iterator[Obj]:
        """Watch events of `path` (a list URL); lists first, then watches from its version.

        Yields the list's items as synthetic ADDED events, then every watch event.
        Reconnects on a closed stream, so a long run survives the server's timeout.
        An ERROR event (410 Gone) ends it with ApiError.
        """
        for attempt in range(30):
            try:
                listing = self.request("GET", path)[1]
                break
            except (ApiError, OSError):
                if attempt == 29 or stop.is_set():
                    raise
                time.sleep(1.0)
        version = listing["metadata"].get("resourceVersion", "")
        for item in listing.get("items", []):
            yield {"type": "ADDED", "object": item}
        while not stop.is_set():
            try:
                with contextlib.closing(self.watch(path, version, timeout_seconds=3000)) as events:
                    for event in events:
                        if stop.is_set():
                            return
                        meta = event.get("object", {}).get("metadata", {})
                        if meta.get("resourceVersion"):
                            version = meta["resourceVersion"]
                        if event.get("type") != "BOOKMARK":
                            yield event
            except (OSError, http.client.HTTPException):
                if stop.is_set():
                    return
                time.sleep(0.2)

    def watch_in_thread(
        self, path: str, handler: Callable[[Obj], None], stop: threading.Event
    ) -> threading.Thread:
        def loop() -> None:
            for event in self.stream(path, stop):
                handler(event)

        thread = threading.Thread(target=loop, name=f"watch {path}", daemon=True)
        thread.start()
        return thread

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
        self._tmp.cleanup()
