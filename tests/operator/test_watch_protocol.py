"""The watch protocol's answers that the local API server cannot be made to give:
an expired watch (410 Gone, as an ERROR event and as a list status) and a stream
cut mid-way. A small HTTP server plays the API server's part for these alone;
every other behaviour of the watches is tested against the real one
(tests/operator/integration/test_watches.py)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

from horovod_operator import watches
from horovod_operator.connection import Connection
from horovod_operator.memory import Key

GONE = {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old resource version"}


def cm(name: str, job: str, version: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"uid-{name}",
            "resourceVersion": version,
            "labels": {"horovod.ai/job-name": job},
        }
    }


class FakeServer:
    """Lists answer from `lists` in turn; watches from `watches` in turn."""

    def __init__(self, lists: list[Any], streams: list[list[dict[str, Any]]]) -> None:
        self.lists, self.streams = lists, streams
        self.requests: list[str] = []

    async def handle(self, request: web.Request) -> web.StreamResponse:
        watch = request.query.get("watch") == "true"
        self.requests.append(f"watch@{request.query['resourceVersion']}" if watch else "list")
        if not watch:
            answer = self.lists.pop(0) if self.lists else {"items": []}
            status = answer.get("code", 200) if answer.get("kind") == "Status" else 200
            return web.json_response(answer, status=status)
        response = web.StreamResponse()
        await response.prepare(request)
        for event in self.streams.pop(0) if self.streams else []:
            await response.write(json.dumps(event).encode() + b"\n")
        if not self.streams and not self.lists:
            await asyncio.sleep(30)  # nothing more to say: hold the watch open
        return response


async def run_against(server: FakeServer, until: Any) -> tuple[watches.Watches, list[Key]]:
    app = web.Application()
    app.router.add_get("/api/v1/namespaces/ns/configmaps", server.handle)
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    changes: list[Key] = []
    watching = watches.Watches(
        Connection(server=f"http://127.0.0.1:{port}"),
        [watches.CONFIG_MAPS],
        ["ns"],
        on_change=changes.append,
        on_synced=lambda: None,
    )
    watching.start()
    try:
        for _ in range(500):
            if until(watching):
                break
            await asyncio.sleep(0.01)
        else:
            raise AssertionError(f"never got there; requests {server.requests}")
    finally:
        await watching.close()
        await runner.cleanup()
    return watching, changes


def test_a_410_event_lists_again_and_forgets_what_went() -> None:
    server = FakeServer(
        lists=[
            {"metadata": {"resourceVersion": "10"}, "items": [cm("a", "a", "9")]},
            {"metadata": {"resourceVersion": "30"}, "items": [cm("b", "b", "29")]},
        ],
        streams=[[{"type": "ERROR", "object": GONE}]],
    )

    watching, changes = asyncio.run(
        run_against(server, lambda w: ("ns", "b") in w.stores["ConfigMap"])
    )
    store = watching.stores["ConfigMap"]
    assert ("ns", "a") not in store
    assert server.requests[:3] == ["list", "watch@10", "list"]
    assert ("ns", "a") in changes[1:]  # told that a went


def test_a_410_list_and_a_cut_stream_are_retried_from_where_they_were() -> None:
    server = FakeServer(
        lists=[GONE, {"metadata": {"resourceVersion": "10"}, "items": []}],
        streams=[
            # A stream that ends after a bookmark: resumed from the bookmark's version.
            [{"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "15"}}}],
            [{"type": "ADDED", "object": cm("c", "c", "16")}],
        ],
    )
    _, changes = asyncio.run(run_against(server, lambda w: ("ns", "c") in w.stores["ConfigMap"]))
    assert server.requests == ["list", "list", "watch@10", "watch@15"]
    assert changes == [("ns", "c")]
