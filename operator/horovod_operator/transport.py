"""The operator's one HTTP stack: TLS, credentials, sessions and the API's refusals.

The watches (watches.py) and every request the reconciler makes (kube.py) go
through aiohttp on the event loop. The requests used to go through urllib3 in a
thread pool: two stacks with their own TLS, credentials and error parsing, and
in a burst of 100 jobs the pool's hand-offs were 37 % of the operator's CPU
(docs/benchmarks/profile-ours-nogang-burst.txt).
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Final, NamedTuple

import aiohttp
from pydantic_core import from_json

from .connection import Connection
from .kube_errors import KubeError

USER_AGENT: Final = "horovod-operator"


def ssl_context(connection: Connection) -> ssl.SSLContext | bool:
    """How to reach `connection`'s server: False for plain HTTP."""
    if not connection.server.startswith("https:"):
        return False
    context = ssl.create_default_context(cafile=connection.ca_file)
    if connection.insecure:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if connection.cert_file:
        context.load_cert_chain(connection.cert_file, connection.key_file)
    return context


def headers(
    connection: Connection, user_agent: str = USER_AGENT, content_type: str | None = None
) -> dict[str, str]:
    """The headers of one request, with the credentials of this moment (a mounted
    ServiceAccount token is read again as kubelet rotates it: connection.py)."""
    result = {"Accept": "application/json", "User-Agent": user_agent}
    if content_type:
        result["Content-Type"] = content_type
    authorization = connection.authorization()
    if authorization:
        result["Authorization"] = authorization
    return result


def refusal(status: int, reason: str, raw: bytes) -> KubeError:
    """The error of a non-2xx answer: the API's Status where the body is one, else the
    first bytes of the body ("404 page not found" for a group nobody serves)."""
    try:
        data = from_json(raw) if raw else {}
    except ValueError:
        data = {}
    if not isinstance(data, dict):
        data = {}
    message = data.get("message") or raw[:500].decode(errors="replace")
    return KubeError(status, str(data.get("reason") or reason), str(message))


def new_session(tls: ssl.SSLContext | bool) -> aiohttp.ClientSession:
    """A session of the running loop. No connection limit of aiohttp's own: a watch
    holds its connection for minutes, and the requests bound their concurrency
    themselves, so that nothing waits for a connection after its last check
    (kube.py's write fence). Nothing from the environment (proxies, .netrc): only
    what the kubeconfig or the ServiceAccount says."""
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=tls, limit=0), trust_env=False)


class Lane(NamedTuple):
    """A loop's session, and the slots that bound its requests in flight."""

    session: aiohttp.ClientSession
    slots: asyncio.Semaphore


class Sessions:
    """One aiohttp session per event loop (a session belongs to the loop it was made
    in), with a semaphore of `in_flight` slots: the operator has one loop; tests and
    tools that call `asyncio.run` more than once get a lane in each, and the lanes of
    loops that have ended are let go."""

    def __init__(self, connection: Connection, in_flight: int) -> None:
        self._ssl = ssl_context(connection)
        self._in_flight = in_flight
        self._lanes: dict[asyncio.AbstractEventLoop, Lane] = {}

    def get(self) -> Lane:
        loop = asyncio.get_running_loop()
        lane = self._lanes.get(loop)
        if lane is None or lane.session.closed:
            self._forget_ended()
            lane = Lane(new_session(self._ssl), asyncio.Semaphore(self._in_flight))
            self._lanes[loop] = lane
        return lane

    def _forget_ended(self) -> None:
        for loop in [loop for loop in self._lanes if loop.is_closed()]:
            session = self._lanes.pop(loop).session
            connector = session.connector
            session.detach()  # closed without its ended loop
            if connector is not None:
                connector._close()  # marks it closed; the collector closes its sockets

    async def close(self) -> None:
        """Close the running loop's session; forget those of ended loops."""
        lane = self._lanes.pop(asyncio.get_running_loop(), None)
        if lane is not None:
            await lane.session.close()
        self._forget_ended()
