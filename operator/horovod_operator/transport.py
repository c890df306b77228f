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
from typing import Final

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


class Sessions:
    """One aiohttp session per event loop (a session belongs to the loop it was made
    in): the operator has one loop; tests and tools that call `asyncio.run` more
    than once get a session in each, and the sessions of loops that have ended are
    let go."""

    def __init__(self, connection: Connection) -> None:
        self._ssl = ssl_context(connection)
        self._sessions: dict[asyncio.AbstractEventLoop, aiohttp.ClientSession] = {}

    def get(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        session = self._sessions.get(loop)
        if session is None or session.closed:
            self._forget_ended()
            session = new_session(self._ssl)
            self._sessions[loop] = session
        return session

    def _forget_ended(self) -> None:
        for loop in [loop for loop in self._sessions if loop.is_closed()]:
            session = self._sessions.pop(loop)
            connector = session.connector
            session.detach()  # closed without its ended loop
            if connector is not None:
                connector._close()  # marks it closed; its sockets end with the loop's

    async def close(self) -> None:
        """Close the running loop's session; forget those of ended loops."""
        loop = asyncio.get_running_loop()
        session = self._sessions.pop(loop, None)
        if session is not None:
            await session.close()
        self._forget_ended()
