"""The kubelet's log endpoint, so that `kubectl logs` (and the API's pod/log) work.

The API server fetches container logs from https://<node InternalIP>:<kubelet
port>/containerLogs/<ns>/<pod>/<container>. The agent's nodes advertise
127.0.0.1 and this server's port; it serves the log files the agent writes.
The control plane runs without --kubelet-certificate-authority, so a
self-signed serving certificate is accepted.

`timestamps=true` is answered as a kubelet does, each line led by an RFC 3339
time. The containers write their log files directly (no pipe through the
agent to stamp lines as they pass), so LogClock notes every 0.25 s how far
each file has grown and a line gets the time its end was first seen: at most
that much late. The operator's time to first step reads these.
"""

from __future__ import annotations

import bisect
import contextlib
import datetime
import http.server
import os
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path

from ..pki import serving_cert

# (namespace, pod, container) -> (log file, whether the container still runs)
Finder = Callable[[str, str, str], tuple[Path, Callable[[], bool]] | None]


class LogClock:
    """When each log file reached each size: [(size, unix time)] per path."""

    def __init__(self, logs_dir: Path, period: float = 0.25):
        self.logs_dir, self.period = logs_dir, period
        self._grown: dict[str, list[tuple[int, float]]] = {}
        self._lock = threading.Lock()
        self._stopped = threading.Event()

    def start(self) -> None:
        threading.Thread(target=self._run, name="logclock", daemon=True).start()

    def stop(self) -> None:
        self._stopped.set()

    def _run(self) -> None:
        while not self._stopped.wait(self.period):
            self.note(time.time())

    def note(self, now: float) -> None:
        """Record the files that grew since the last look."""
        with contextlib.suppress(OSError):
            for pod_dir in os.scandir(self.logs_dir):
                with contextlib.suppress(OSError):
                    for entry in os.scandir(pod_dir.path):
                        if entry.name.endswith(".log"):
                            self._note(entry.path, entry.stat().st_size, now)

    def _note(self, path: str, size: int, now: float) -> None:
        with self._lock:
            grown = self._grown.setdefault(path, [])
            if not grown or size > grown[-1][0]:
                grown.append((size, now))

    def stamped(
        self, path: Path, data: bytes, since: float | None = None, stamps: bool = True
    ) -> bytes:
        """`data` (the file from its start) with each line led by its time (`stamps`),
        without the lines from before `since` (unix time), as the kubelet's sinceTime."""
        with self._lock:
            grown = list(self._grown.get(str(path), ()))
        sizes = [size for size, _ in grown]
        now = time.time()
        out, end = [], 0
        for line in data.splitlines(keepends=True):
            end += len(line)
            i = bisect.bisect_left(sizes, end)
            seen = grown[i][1] if i < len(grown) else now
            if since is not None and seen < since:
                continue
            out.append(format_stamp(seen).encode() + b" " + line if stamps else line)
        return b"".join(out)


def format_stamp(unix: float) -> str:
    """RFC 3339 in UTC with nanoseconds, as the kubelet writes it."""
    moment = datetime.datetime.fromtimestamp(unix, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond:06d}000Z"


def _since(query: dict[str, list[str]]) -> float | None:
    """sinceTime (RFC 3339, whole seconds as the API server passes it) as unix time."""
    raw = query.get("sinceTime", [""])[0]
    if not raw:
        return None
    moment = datetime.datetime.fromisoformat(raw.replace("Z", "+00:00"))
    return moment.timestamp()


class LogServer:
    def __init__(self, find: Finder, pki_dir: Path, clock: LogClock | None = None):
        self.find = find
        self.clock = clock
        cert, key = serving_cert(pki_dir, "kubelet", "nodeagent")
        handler = self._handler()
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]

    def start(self) -> None:
        if self.clock is not None:
            self.clock.start()
        threading.Thread(target=self.server.serve_forever, name="logserver", daemon=True).start()

    def stop(self) -> None:
        if self.clock is not None:
            self.clock.stop()
        self.server.shutdown()
        self.server.server_close()

    def _handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        find = self.find
        clock = self.clock

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *_args: object) -> None:
                pass

            def do_GET(self) -> None:
                url = urllib.parse.urlparse(self.path)
                parts = url.path.strip("/").split("/")
                if len(parts) != 4 or parts[0] != "containerLogs":
                    self.send_error(404, "only /containerLogs/<ns>/<pod>/<container> is served")
                    return
                found = find(parts[1], parts[2], parts[3])
                if found is None:
                    self.send_error(404, f"no log of {parts[1]}/{parts[2]}/{parts[3]}")
                    return
                path, running = found
                query = urllib.parse.parse_qs(url.query)
                follow = query.get("follow", ["false"])[0] == "true"
                data = path.read_bytes()
                offset = len(data)
                stamps = query.get("timestamps", ["false"])[0] == "true"
                since = _since(query)
                if (stamps or since is not None) and clock is not None:
                    data = clock.stamped(path, data, since, stamps)
                if "tailLines" in query:
                    lines = data.splitlines(keepends=True)
                    data = b"".join(lines[-int(query["tailLines"][0]) :]) if lines else b""
                if "limitBytes" in query:
                    data = data[: int(query["limitBytes"][0])]
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                if not follow:
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                # HTTP/1.0 (BaseHTTPRequestHandler's): the body ends when the connection closes.
                self.end_headers()
                with contextlib.suppress(OSError), open(path, "rb") as f:
                    f.seek(offset)
                    if data:
                        self._send(data)
                    idle = 0.0
                    while idle < 1.0:
                        chunk = f.read()
                        if chunk:
                            self._send(chunk)
                            idle = 0.0
                            continue
                        if not running():
                            idle += 0.2
                        time.sleep(0.2)

            def _send(self, data: bytes) -> None:
                self.wfile.write(data)
                self.wfile.flush()

        return Handler
