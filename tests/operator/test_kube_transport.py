"""The client's HTTP behaviour against a real socket: retries, the write fence, refusals,
one session per event loop (transport.py, kube.py)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import aiohttp
import pytest

from horovod_operator.connection import Connection
from horovod_operator.kube import Kube
from horovod_operator.kube_errors import KubeError, NotLeader

CONFIG_MAP = {"kind": "ConfigMap", "apiVersion": "v1", "metadata": {"name": "c", "namespace": "ns"}}


@dataclass
class Server:
    """Answers each request with the next of `answers`: bytes to send (then it keeps the
    connection), None to close the connection without a word, "hang" to say nothing."""

    answers: list[bytes | str | None]
    requests: list[bytes] = field(default_factory=list)
    url: str = ""


def _http(status: int, body: bytes, content_type: str = "application/json") -> bytes:
    head = f"HTTP/1.1 {status} X\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
    return head.encode() + b"\r\n" + body


def _read_request(conn: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return b""
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    while len(rest) < length:
        rest += conn.recv(65536)
    return head


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Iterator[Server]:
    state = Server(answers=list(request.param))
    listener = socket.create_server(("127.0.0.1", 0))
    state.url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    held: list[socket.socket] = []

    lock = threading.Lock()

    def answer(conn: socket.socket) -> None:
        try:
            converse(conn)
        except OSError:  # the test ended and closed it
            return

    def converse(conn: socket.socket) -> None:
        while True:
            head = _read_request(conn)
            with lock:
                if not head or not state.answers:
                    return
                state.requests.append(head)
                reply = state.answers.pop(0)
            if reply is None:
                conn.close()
                return
            if reply == "hang":
                return
            assert isinstance(reply, bytes)
            conn.sendall(reply)

    def serve() -> None:
        # A thread per connection: a client may hold one open while it opens another.
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            held.append(conn)
            threading.Thread(target=answer, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield state
    finally:
        listener.close()
        for conn in held:
            conn.close()


OK = _http(200, json.dumps(CONFIG_MAP).encode())


@pytest.mark.parametrize("server", [[None, None, OK]], indirect=True)
def test_a_connection_closed_before_the_answer_is_tried_again(server: Server) -> None:
    async def get() -> object:
        kube = Kube(Connection(server.url))
        try:
            return await kube.get("ConfigMap", "ns", "c")
        finally:
            await kube.close()

    assert asyncio.run(get()) == CONFIG_MAP
    assert len(server.requests) == 3


@pytest.mark.parametrize("server", [[None, OK]], indirect=True)
def test_the_elector_s_client_tries_nothing_twice(server: Server) -> None:
    # A write: aiohttp itself sends an idempotent request once more when a kept-alive
    # connection closes under it (RFC 9112), which the elector's round budget bounds.
    async def create() -> object:
        kube = Kube(Connection(server.url), retries=0)
        try:
            return await kube.create(CONFIG_MAP)
        finally:
            await kube.close()

    with pytest.raises(aiohttp.ClientConnectionError):
        asyncio.run(create())
    assert len(server.requests) == 1


@pytest.mark.parametrize("server", [["hang", OK]], indirect=True)
def test_a_read_that_timed_out_is_not_sent_again(server: Server) -> None:
    async def create() -> object:
        kube = Kube(Connection(server.url), timeout=(1.0, 0.5))
        try:
            return await kube.create(CONFIG_MAP)
        finally:
            await kube.close()

    with pytest.raises(TimeoutError):
        asyncio.run(create())
    assert len(server.requests) == 1  # a create that may have been done is not repeated


@pytest.mark.parametrize("server", [[OK, OK]], indirect=True)
def test_no_write_leaves_a_replica_that_does_not_hold_the_lease(server: Server) -> None:
    holds = [True]

    async def writes() -> None:
        kube = Kube(Connection(server.url), may_write=lambda: holds[0])
        try:
            await kube.create(CONFIG_MAP)
            holds[0] = False
            with pytest.raises(NotLeader):
                await kube.create(CONFIG_MAP)
            # Reads go on: a standby keeps its view.
            assert await kube.get("ConfigMap", "ns", "c") == CONFIG_MAP
        finally:
            await kube.close()

    asyncio.run(writes())
    assert [head.split(b" ")[0] for head in server.requests] == [b"POST", b"GET"]


REFUSED = _http(
    403,
    json.dumps({"kind": "Status", "reason": "Forbidden", "message": "no, says quota"}).encode(),
)
PLAIN_404 = _http(404, b"404 page not found", "text/plain")


@pytest.mark.parametrize("server", [[REFUSED, PLAIN_404]], indirect=True)
def test_refusals_carry_the_api_s_reason_and_message(server: Server) -> None:
    async def refused() -> tuple[KubeError, bool]:
        kube = Kube(Connection(server.url))
        try:
            with pytest.raises(KubeError) as forbidden:
                await kube.create(CONFIG_MAP)
            return forbidden.value, await kube.serves("kueue.x-k8s.io/v1beta2", "workloads")
        finally:
            await kube.close()

    error, served = asyncio.run(refused())
    assert (error.status, error.reason, error.message) == (403, "Forbidden", "no, says quota")
    assert served is False  # a plain-text 404: nobody serves the group


@pytest.mark.parametrize("server", [[OK, OK]], indirect=True)
def test_one_client_serves_one_event_loop_after_another(server: Server) -> None:
    kube = Kube(Connection(server.url))

    async def get(then_close: bool) -> object:
        try:
            return await kube.get("ConfigMap", "ns", "c")
        finally:
            if then_close:
                await kube.close()

    assert asyncio.run(get(then_close=False)) == CONFIG_MAP
    # The first loop has ended without closing its session; the second gets its own
    # and lets the first go (closed: no warning of an unclosed session).
    assert asyncio.run(get(then_close=True)) == CONFIG_MAP
    assert kube._sessions._lanes == {}
