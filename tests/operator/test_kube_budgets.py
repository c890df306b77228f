"""The client's two token buckets: describing reads never spend the reconciler's."""

from __future__ import annotations

import asyncio
import http.server
import threading
from collections.abc import Iterator

import pytest

from horovod_operator.connection import Connection
from horovod_operator.kube import Kube
from horovod_operator.rate_limit import DIAGNOSTIC_QPS


class _Logs(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"HVJOB_RANK rank=0 size=1\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Logs)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()


def test_pod_log_reads_spend_their_own_budget_not_the_creates(server: str) -> None:
    kube = Kube(Connection(server), qps=50.0, burst=3)

    async def read_logs() -> None:
        try:
            for _ in range(6):  # twice the main burst
                assert "rank=0" in await kube.pod_log("ns", "p", None, 1024)
        finally:
            await kube.close()

    asyncio.run(read_logs())
    # Every main token is still there: a create would go at once.
    assert kube._limiter._tokens == 3
    assert kube._diagnostics.qps == DIAGNOSTIC_QPS


def test_an_unlimited_client_has_unlimited_diagnostics_too() -> None:
    kube = Kube(Connection("http://127.0.0.1:9"), qps=0, burst=0)
    assert kube._diagnostics.qps == 0
