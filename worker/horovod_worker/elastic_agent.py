"""A worker pod's main process in an elastic job: starts and stops ranks when the driver asks.

``python -m horovod_worker.elastic_agent -- COMMAND ...`` runs in every worker
pod of a HorovodJob with spec.elastic (launchMode gloo). Horovod's elastic
driver, in the launcher pod (horovod_worker.elastic_launcher), decides which
ranks run where and changes that as workers come and go; horovodrun would start
them over ssh. Here the driver asks this agent instead, over HTTP on
contract.ELASTIC_AGENT_PORT (JSON bodies):

``GET /ready``
    200 ``{"host", "slots", "index"}`` while the pod can take ranks, 503 once it
    is stopping. The pod's readiness probe asks the same, so Kubernetes' Ready
    and the driver's host discovery agree. ``host`` is the name Horovod knows
    this pod by: the worker's name and a token new in every agent, so that the
    pod that replaces a lost one (same name) is a new host to Horovod, not the
    lost one it has blacklisted.
``POST /ranks/<slot>``
    start COMMAND for that slot with the rank's Horovod variables
    (``{"env": {...}}``). Only the names in SLOT_ENV are taken, and the command
    is this pod's own: the caller chooses a rank, never what runs.
``GET /ranks/<slot>?wait=S``
    ``{"running", "exit_code"}``, waiting up to S seconds for the rank to end.
``POST /ranks/<slot>/stop``
    SIGTERM to the rank (the driver dropped this host), SIGKILL after a grace.
``POST /finish``
    the job is over: the agent exits once its ranks have.

SIGTERM (the pod is going away: deleted, evicted, its job suspended) makes the
agent answer 503 at once and forwards the signal to the ranks: the trainers
agree among all ranks whether every rank got it (a suspension: rank 0 writes a
checkpoint and all stop) or only some (those leave after a commit and the rest
go on without them; horovod_worker.torch_elastic). The agent exits when its
ranks have, within the pod's terminationGracePeriodSeconds.

A rank that fails on its own (not stopped, the pod not stopping) ends the
agent with its exit code: the pod fails, the operator replaces it, and the new
pod joins as a new host. Standard library only, like gloo_worker.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Final
from urllib.parse import parse_qs, urlsplit

import horovod_contract as contract

from .gloo_worker import (
    STOP_GRACE_SECONDS,
    PlanError,
    TaggedOutput,
    exit_code_of,
    rendezvous_address,
    rendezvous_env,
    require_env,
    route_interface,
    signal_group,
    spawn,
)

PREFIX = "elastic_agent:"
# The only variables a caller may set for a rank: its place in the job, as
# horovodrun's elastic driver gives it (gloo_run.create_slot_env_vars).
SLOT_ENV: Final = frozenset(
    {
        "HOROVOD_HOSTNAME",
        "HOROVOD_RANK",
        "HOROVOD_SIZE",
        "HOROVOD_LOCAL_RANK",
        "HOROVOD_LOCAL_SIZE",
        "HOROVOD_CROSS_RANK",
        "HOROVOD_CROSS_SIZE",
    }
)
# The longest a GET /ranks/<slot>?wait=S waits (the driver asks again).
MAX_WAIT_SECONDS: Final = 30.0
# Tests run several agents on one host, each on its own port.
PORT_ENV: Final = "HVJOB_ELASTIC_AGENT_PORT"
# After every rank ended well, how long the agent waits for the launcher's
# /finish before it exits anyway (the launcher may be gone already).
FINISH_WAIT_SECONDS: Final = 60.0


def say(message: str) -> None:
    print(f"{PREFIX} {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class AgentPlan:
    """What the operator told this worker (contract.ENV_*)."""

    rendezvous_host: str
    rendezvous_port: int
    index: int
    name: str
    slots: int
    port: int

    @property
    def host(self) -> str:
        """Horovod's name for this pod: no ':' (Horovod splits '<host>:<slot>')."""
        return f"{self.name.split('.')[0]}-{_TOKEN}"


_TOKEN: Final = secrets.token_hex(4)


def plan_from_env(env: Mapping[str, str]) -> AgentPlan:
    names = (
        contract.ENV_GLOO_RENDEZVOUS,
        contract.ENV_WORKER_INDEX,
        contract.ENV_WORKER_HOST,
        contract.ENV_SLOTS_PER_WORKER,
    )
    require_env(env, names, "spec.elastic")
    host, port = rendezvous_address(env)
    numbers = {}
    for name in (contract.ENV_WORKER_INDEX, contract.ENV_SLOTS_PER_WORKER):
        text = env[name]
        if not text.isdigit():
            raise PlanError(f"{name} must be a non-negative integer, got {text!r}")
        numbers[name] = int(text)
    if numbers[contract.ENV_SLOTS_PER_WORKER] < 1:
        raise PlanError(f"{contract.ENV_SLOTS_PER_WORKER} must be at least 1")
    return AgentPlan(
        rendezvous_host=host,
        rendezvous_port=port,
        index=numbers[contract.ENV_WORKER_INDEX],
        name=env[contract.ENV_WORKER_HOST],
        slots=numbers[contract.ENV_SLOTS_PER_WORKER],
        port=contract.ELASTIC_AGENT_PORT,
    )


class Agent:
    """The pod's ranks, one per slot at most, and the agent's own state."""

    def __init__(self, plan: AgentPlan, command: Sequence[str], env: Mapping[str, str]) -> None:
        self.plan = plan
        self.command = list(command)
        self.env = dict(env)
        self.lock = threading.Condition()
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.stopped: set[int] = set()  # slots whose rank we were asked to stop
        self.stopping = False  # SIGTERM: the pod is going away
        self.finished = False  # the launcher said the job is over
        self.failure: int | None = None  # a rank failed on its own: the agent's exit code
        self.rendezvous: tuple[str, str] | None = None  # (address, interface), found once
        self.output = TaggedOutput()

    # -- what the driver asks
    def ready(self) -> dict[str, Any] | None:
        with self.lock:
            if self.stopping or self.finished or self.failure is not None:
                return None
        return {"host": self.plan.host, "slots": self.plan.slots, "index": self.plan.index}

    def start(self, slot: int, slot_env: Mapping[str, str]) -> tuple[HTTPStatus, str]:
        if not 0 <= slot < self.plan.slots:
            return HTTPStatus.NOT_FOUND, f"slot {slot}: this worker has {self.plan.slots}"
        unknown = sorted(set(slot_env) - SLOT_ENV)
        if unknown:
            return HTTPStatus.BAD_REQUEST, f"not a rank's variable: {', '.join(unknown)}"
        if slot_env.get("HOROVOD_HOSTNAME") != self.plan.host:
            return HTTPStatus.CONFLICT, f"this worker is {self.plan.host}"
        if slot_env.get("HOROVOD_LOCAL_RANK") != str(slot):
            return HTTPStatus.BAD_REQUEST, f"HOROVOD_LOCAL_RANK must be {slot}"
        with self.lock:
            if self.ready() is None:
                return HTTPStatus.SERVICE_UNAVAILABLE, "this worker is stopping"
            proc = self.procs.get(slot)
            if proc is not None and proc.poll() is None:
                return HTTPStatus.CONFLICT, f"slot {slot} runs rank pid {proc.pid} already"
            try:
                address, iface = self._rendezvous()
            except OSError as error:
                return HTTPStatus.SERVICE_UNAVAILABLE, f"the rendezvous is unreachable: {error}"
            env = {
                **self.env,
                **rendezvous_env(address, self.plan.rendezvous_port, iface),
                "HOROVOD_ELASTIC": "1",
                **slot_env,
            }
            try:
                proc = spawn(self.command, env)
            except OSError as error:
                return (
                    HTTPStatus.INTERNAL_SERVER_ERROR,
                    f"cannot start {self.command[0]!r}: {error}",
                )
            self.procs[slot] = proc
            self.stopped.discard(slot)
            rank = int(slot_env.get("HOROVOD_RANK", "-1"))
            self.output.follow(rank, proc)
            threading.Thread(target=self._reap, args=(slot, proc), daemon=True).start()
        say(f"slot {slot}: started rank {rank} of {slot_env.get('HOROVOD_SIZE')} (pid {proc.pid})")
        return HTTPStatus.OK, str(proc.pid)

    def status(self, slot: int, wait: float) -> dict[str, Any] | None:
        deadline = time.monotonic() + min(max(wait, 0.0), MAX_WAIT_SECONDS)
        with self.lock:
            while True:
                proc = self.procs.get(slot)
                if proc is None:
                    return None
                code = proc.poll()
                if code is not None:
                    return {"running": False, "exit_code": exit_code_of(code)}
                left = deadline - time.monotonic()
                if left <= 0:
                    return {"running": True, "exit_code": None}
                self.lock.wait(min(left, 0.5))

    def stop(self, slot: int) -> bool:
        with self.lock:
            proc = self.procs.get(slot)
            if proc is None:
                return False
            self.stopped.add(slot)
        say(f"slot {slot}: stopping its rank (pid {proc.pid}) as the driver asked")
        _stop_later(proc)
        return True

    def finish(self) -> None:
        with self.lock:
            self.finished = True
            self.lock.notify_all()

    # -- the pod
    def terminate(self) -> None:
        """SIGTERM: answer 503 from now on, and let the ranks know (they decide
        together what it means: docs/elastic.md)."""
        with self.lock:
            self.stopping = True
            procs = list(self.procs.values())
            self.lock.notify_all()
        for proc in procs:
            signal_group(proc, signal.SIGTERM)

    def _rendezvous(self) -> tuple[str, str]:
        if self.rendezvous is None:
            infos = socket.getaddrinfo(
                self.plan.rendezvous_host,
                self.plan.rendezvous_port,
                socket.AF_INET,
                socket.SOCK_STREAM,
            )
            address = str(infos[0][4][0])
            self.rendezvous = (address, route_interface(address, self.plan.rendezvous_port))
        return self.rendezvous

    def _reap(self, slot: int, proc: subprocess.Popen[bytes]) -> None:
        code = exit_code_of(proc.wait())
        with self.lock:
            asked = slot in self.stopped or self.stopping or self.finished
            if code != 0 and not asked and self.failure is None:
                self.failure = code
            self.lock.notify_all()
        how = "as asked" if asked else "on its own"
        say(f"slot {slot}: rank pid {proc.pid} exited with code {code} ({how})")

    def running(self) -> list[subprocess.Popen[bytes]]:
        return [p for p in self.procs.values() if p.poll() is None]

    def wait_to_exit(self) -> int:
        """Block until the agent should exit; returns its exit code."""
        idle_since: float | None = None
        stopping_the_rest = False
        with self.lock:
            while True:
                busy = bool(self.running())
                if not busy and self.failure is not None:
                    say(f"a rank failed with exit code {self.failure}; this worker ends with it")
                    return self.failure
                if not busy and (self.stopping or self.finished):
                    return 128 + signal.SIGTERM if self.stopping and not self.finished else 0
                if self.failure is not None and not stopping_the_rest:
                    # The failure stops this pod's other ranks too; the pod is replaced.
                    stopping_the_rest = True
                    for proc in self.running():
                        _stop_later(proc)
                if not busy and self.procs:
                    # Every rank ended well: the job is done; the launcher says so.
                    idle_since = idle_since or time.monotonic()
                    if time.monotonic() - idle_since > FINISH_WAIT_SECONDS:
                        say("every rank ended well and no launcher said /finish; exiting")
                        return 0
                else:
                    idle_since = None
                self.lock.wait(0.5)


def _stop_later(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM now, SIGKILL after STOP_GRACE_SECONDS if it still runs."""
    signal_group(proc, signal.SIGTERM)

    def kill() -> None:
        try:
            proc.wait(timeout=STOP_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            signal_group(proc, signal.SIGKILL)

    threading.Thread(target=kill, daemon=True).start()


class _Handler(BaseHTTPRequestHandler):
    agent: Agent  # set on the subclass made by serve()

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the agent says what matters itself

    def _reply(self, status: HTTPStatus, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(length) or b"{}")

    def _slot(self, parts: list[str]) -> int | None:
        return int(parts[1]) if len(parts) >= 2 and parts[1].isdigit() else None

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        parts = [p for p in url.path.split("/") if p]
        if url.path == contract.ELASTIC_READY_PATH:
            ready = self.agent.ready()
            if ready is None:
                self._reply(HTTPStatus.SERVICE_UNAVAILABLE, {"ready": False})
            else:
                self._reply(HTTPStatus.OK, {"ready": True, **ready})
            return
        slot = self._slot(parts)
        if parts[:1] == ["ranks"] and len(parts) == 2 and slot is not None:
            wait = float((parse_qs(url.query).get("wait") or ["0"])[0])
            status = self.agent.status(slot, wait)
            if status is None:
                self._reply(HTTPStatus.NOT_FOUND, {"error": f"no rank was started in slot {slot}"})
            else:
                self._reply(HTTPStatus.OK, status)
            return
        self._reply(HTTPStatus.NOT_FOUND, {"error": f"no such path {url.path}"})

    def do_POST(self) -> None:
        parts = [p for p in urlsplit(self.path).path.split("/") if p]
        slot = self._slot(parts)
        try:
            body = self._body()
        except ValueError as error:
            self._reply(HTTPStatus.BAD_REQUEST, {"error": f"not JSON: {error}"})
            return
        if parts == ["finish"]:
            self.agent.finish()
            self._reply(HTTPStatus.OK, {})
        elif parts[:1] == ["ranks"] and len(parts) == 2 and slot is not None:
            env = body.get("env") if isinstance(body, dict) else None
            if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
                self._reply(HTTPStatus.BAD_REQUEST, {"error": 'the body must be {"env": {...}}'})
                return
            status, detail = self.agent.start(slot, env)
            self._reply(
                status, {"pid": int(detail)} if status == HTTPStatus.OK else {"error": detail}
            )
        elif parts[:1] == ["ranks"] and parts[2:] == ["stop"] and slot is not None:
            found = self.agent.stop(slot)
            self._reply(HTTPStatus.OK if found else HTTPStatus.NOT_FOUND, {})
        else:
            self._reply(HTTPStatus.NOT_FOUND, {"error": f"no such path {self.path}"})


def serve(agent: Agent, port: int) -> ThreadingHTTPServer:
    handler = type("AgentHandler", (_Handler,), {"agent": agent})
    server = ThreadingHTTPServer(("", port), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def run(plan: AgentPlan, command: Sequence[str], env: Mapping[str, str]) -> int:
    agent = Agent(plan, command, env)
    signal.signal(signal.SIGTERM, lambda _signum, _frame: agent.terminate())
    signal.signal(signal.SIGINT, lambda _signum, _frame: agent.terminate())
    try:
        server = serve(agent, plan.port)
    except OSError as error:
        say(f"cannot listen on port {plan.port}: {error}")
        return 1
    say(
        f"worker {plan.index} ({plan.name}) is elastic host {plan.host} with {plan.slots} "
        f"slot(s); waiting for the driver at {plan.rendezvous_host}:{plan.rendezvous_port} "
        f"to start ranks (agent on port {plan.port})"
    )
    code = agent.wait_to_exit()
    server.shutdown()
    agent.output.join()
    say(f"worker {plan.index}: exiting with code {code}")
    return code


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--"]:
        args = args[1:]
    if not args or args[0].startswith("-"):
        say("usage: python -m horovod_worker.elastic_agent -- COMMAND [ARG ...]")
        return 2
    try:
        plan = plan_from_env(os.environ)
    except PlanError as error:
        say(str(error))
        return 2
    port = os.environ.get(PORT_ENV)
    if port:
        plan = AgentPlan(**{**plan.__dict__, "port": int(port)})
    return run(plan, args, os.environ)


if __name__ == "__main__":
    sys.exit(main())
