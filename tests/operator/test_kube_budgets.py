"""The client's token buckets: describing reads never spend the reconciler's, and the
HorovodJobs' own requests have a bucket beside the children's."""

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

    def do_PATCH(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        body = b"{}"
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
        httpd.server_close()


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


def test_job_status_writes_spend_a_bucket_of_their_own(server: str) -> None:
    """As a CRD's generated clientset in client-go has its own token bucket beside the
    core clientset's (mpi-operator's MPIJob writes): a job's status write never waits
    behind other jobs' pod creates, and takes none of their tokens."""
    kube = Kube(Connection(server), qps=50.0, burst=3)

    async def write_statuses() -> None:
        try:
            for _ in range(3):
                await kube.patch_job_status("ns", "j", "1", {"phase": "Running"})
        finally:
            await kube.close()

    asyncio.run(write_statuses())
    assert kube._limiter._tokens == 3  # every child's token is still there
    assert kube._jobs._tokens <= 2  # the jobs' own bucket paid for the last one at least
