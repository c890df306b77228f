"""The kubelet's log endpoint, so that `kubectl logs` (and the API's pod/log) work.

The API server fetches container logs from https://<node InternalIP>:<kubelet
port>/containerLogs/<ns>/<pod>/<container>. The agent's nodes advertise
127.0.0.1 and this server's port; it serves the log files the agent writes.
The control plane runs without --kubelet-certificate-authority, so a
self-signed serving certificate is accepted.
"""

from __future__ import annotations

import contextlib
import http.server
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path

from ..pki import serving_cert

# (namespace, pod, container) -> (log file, whether the container still runs)
Finder = Callable[[str, str, str], tuple[Path, Callable[[], bool]] | None]


class LogServer:
    def __init__(self, find: Finder, pki_dir: Path):
        self.find = find
        cert, key = serving_cert(pki_dir, "kubelet", "nodeagent")
        handler = self._handler()
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]

    def start(self) -> None:
        threading.Thread(target=self.server.serve_forever, name="logserver", daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        find = self.find

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
