"""The launcher of an elastic job: Horovod's elastic driver, without ssh.

``python -m horovod_worker.elastic_launcher --agents FILE --np N --min-np A --max-np B``
runs what ``horovodrun --min-np A --max-np B --host-discovery-script ...`` runs:
Horovod's own ElasticDriver (horovod.runner.elastic.driver) and its rendezvous
server, which hand out ranks, notice workers leaving and arriving, and reset
the ranks to the new set. Two parts of horovodrun are replaced:

- **host discovery**: instead of a script run every second (mpi-operator's is a
  file in a ConfigMap, which the kubelet refreshes a minute or more late), every
  worker the job may have (FILE: one ``<host>:<port>`` per line, up to
  maxReplicas, written once by the operator) is asked directly, every
  DISCOVERY_SECONDS, whether it can take ranks (``GET /ready`` on its agent,
  horovod_worker.elastic_agent). The pod's readiness probe asks the same, so
  the hosts Horovod uses are the pods Kubernetes shows Ready.
- **starting a rank**: instead of ssh, ``POST /ranks/<slot>`` to the host's agent
  with the rank's Horovod variables; the rank's exit code comes back from the
  agent, and a rank the driver drops is stopped through it.

The launcher's exit code is the job's: 0 when the ranks finished training, 1
when they failed or the job stayed below --min-np for --timeout seconds, 143
when the launcher was asked to stop (SIGTERM: it asks every rank to stop, which
the trainers turn into a checkpoint, and waits for them).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from horovod.runner.elastic.discovery import HostDiscovery

import horovod_contract as contract

PREFIX = "elastic_launcher:"
# How often the workers are asked whether they can take ranks (Horovod's driver
# asks its discovery every second; answers are reused in between).
DISCOVERY_SECONDS: Final = 2.0
PROBE_TIMEOUT_SECONDS: Final = 2.0
# Rounds a ready worker may fail to answer in time and still be a host.
SLOW_ROUNDS: Final = 3
# Horovod's driver logging (0, 1 or 2: its notifications to the ranks); --verbose.
VERBOSE_ENV: Final = "HVJOB_ELASTIC_VERBOSE"
# A rank's agent that does not answer this long is taken as lost with its rank.
AGENT_LOST_SECONDS: Final = 15.0
# Each wait for a rank's exit asks the agent to hold the answer this long.
POLL_SECONDS: Final = 5.0
DEFAULT_TIMEOUT_SECONDS: Final = 600
# At the end, how long the launcher waits for the workers' agents to exit.
FINISH_WAIT_SECONDS: Final = 30.0


def say(message: str) -> None:
    print(f"{PREFIX} {message}", flush=True)


def request(
    address: str, method: str, path: str, body: Any = None, timeout: float = 5.0
) -> tuple[int, Any]:
    """One JSON request to an agent: (HTTP status, decoded body). OSError when unreachable."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://{address}{path}", data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as error:
        # An error status is an answer; its body may still be cut short (an agent
        # exiting as it answers 503), which the handler below cannot catch.
        try:
            return error.code, json.loads(error.read() or b"{}")
        except ValueError:
            return error.code, {}
        except http.client.HTTPException as cut:
            raise OSError(f"{address}: no complete answer ({cut!r})") from cut
    except (ValueError, http.client.HTTPException) as error:
        # Not JSON, or cut short (an agent exiting as it answers): not an answer.
        raise OSError(f"{address}: no complete answer ({error!r})") from error


@dataclass(frozen=True)
class Worker:
    """A worker that answered ready: Horovod's host name for it, where it is (its
    `<name>:<port>` in the agents file), and the pod IP its name had then."""

    host: str
    slots: int
    index: int
    address: str
    ip: str = ""

    @property
    def endpoint(self) -> str:
        """Where to reach its agent: the pod's IP, which stays its own while the pod
        lives (a name may fail to resolve for a while; the IP does not move)."""
        port = self.address.rpartition(":")[2]
        return f"{self.ip}:{port}" if self.ip else self.address


def resolve_ipv4(host: str) -> str:
    return str(socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)[0][4][0])


class Slow(Exception):
    """The agent did not answer in time: a busy pod, not a gone one."""


def probe(address: str, last_ip: str | None = None) -> Worker | None:
    """The worker at `address` if it can take ranks now, None if it cannot (it
    answered 503 or refused the connection, or its name does not resolve and it
    had no IP yet: not created, or gone). A worker Ready before whose name does
    not resolve now is asked at the IP it had (cluster DNS hiccups; the pod's IP
    is its own while it lives). Raises Slow when it did not answer in time."""
    host, _, port = address.rpartition(":")
    try:
        ip = resolve_ipv4(host)
    except OSError:
        if last_ip is None:
            return None
        ip = last_ip
    try:
        status, body = request(
            f"{ip}:{port}", "GET", contract.ELASTIC_READY_PATH, timeout=PROBE_TIMEOUT_SECONDS
        )
    except TimeoutError as error:
        raise Slow(str(error)) from error
    except OSError as error:
        if isinstance(getattr(error, "reason", None), TimeoutError):
            raise Slow(str(error)) from error
        return None
    if status != 200 or not isinstance(body, dict):
        return None
    try:
        return Worker(str(body["host"]), int(body["slots"]), int(body["index"]), address, ip)
    except (KeyError, TypeError, ValueError):
        return None


class AgentDiscovery(HostDiscovery):  # type: ignore[misc]
    """Horovod's HostDiscovery over the workers' agents."""

    def __init__(
        self,
        agents: Sequence[str],
        ask: Callable[[str, str | None], Worker | None] = probe,
        interval: float = DISCOVERY_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.agents = list(agents)
        self.ask = ask
        self.interval = interval
        self.clock = clock
        self.lock = threading.Lock()
        self.ready: dict[str, Worker] = {}
        self.known: dict[str, Worker] = {}  # every worker seen, for their addresses
        self.slow: dict[str, int] = {}  # address -> rounds in a row it did not answer in time
        self.gone: set[str] = set()  # addresses whose last answer was "not ready" or refused
        self.asked_at: float | None = None
        self.pool = ThreadPoolExecutor(max_workers=max(1, min(32, len(self.agents))))

    def find_available_hosts_and_slots(self) -> dict[str, int]:
        with self.lock:
            now = self.clock()
            if self.asked_at is None or now - self.asked_at >= self.interval:
                self.asked_at = now
                found: dict[str, Worker] = {}
                answers = self.pool.map(self._ask, self.agents)
                for address, answer in zip(self.agents, answers, strict=True):
                    if answer is not None:
                        found[answer.host] = answer
                        self.slow.pop(address, None)
                        continue
                    # A ready worker that answers slowly (its pod busy) stays a host
                    # for SLOW_ROUNDS rounds: a dropped host makes every rank reset.
                    kept = self._still_ready(address)
                    if kept is not None:
                        found[kept.host] = kept
                if set(found) != set(self.ready):
                    self._report(found)
                self.ready = found
                self.known.update(found)
            return {host: worker.slots for host, worker in self.ready.items()}

    def _ask(self, address: str) -> Worker | None:
        last = next((w for w in self.ready.values() if w.address == address), None)
        try:
            answer = self.ask(address, last.ip if last else None)
        except Slow:
            self.slow[address] = self.slow.get(address, 0) + 1
            return None
        if answer is None:
            self.slow.pop(address, None)
            self.gone.add(address)
        else:
            self.gone.discard(address)
        return answer

    def _still_ready(self, address: str) -> Worker | None:
        if address in self.gone or self.slow.get(address, 0) > SLOW_ROUNDS:
            return None
        return next((w for w in self.ready.values() if w.address == address), None)

    def address_of(self, host: str) -> str | None:
        """Where to reach the agent of a host seen Ready: its pod's IP and port."""
        with self.lock:
            worker = self.known.get(host)
            return worker.endpoint if worker else None

    def endpoints(self) -> list[str]:
        """Every agent to tell the end: those seen Ready at their IP, the others by name."""
        with self.lock:
            seen = {w.address: w.endpoint for w in self.known.values()}
        return [seen.get(address, address) for address in self.agents]

    def index_of(self, host: str) -> int:
        with self.lock:
            worker = self.known.get(host)
            return worker.index if worker else sys.maxsize

    def _report(self, found: dict[str, Worker]) -> None:
        def names(hosts: Sequence[str], workers: dict[str, Worker]) -> str:
            return ", ".join(f"worker {workers[h].index} ({h})" for h in sorted(hosts)) or "none"

        added = [h for h in found if h not in self.ready]
        gone = [h for h in self.ready if h not in found]
        parts = [f"{len(found)} worker(s) ready"]
        if added:
            parts.append(f"new: {names(added, found)}")
        if gone:
            parts.append(f"gone: {names(gone, self.ready)}")
        say("; ".join(parts))


class FixedPortRendezvous:
    """Horovod's RendezvousServer, on the port the operator gave the workers
    (Horovod's own picks a free port), saying each new plan."""

    def __init__(self, port: int, discovery: AgentDiscovery) -> None:
        self.port = port
        self.discovery = discovery
        self.httpd: Any = None
        self.thread: threading.Thread | None = None
        self.round = 0

    def start(self, handler_cls: Any) -> int:
        from horovod.runner.http.http_server import RendezvousHTTPServer

        self.httpd = RendezvousHTTPServer(("", self.port), handler_cls, 0)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        return self.port

    def init(self, host_alloc_plan: Sequence[Any]) -> None:
        self.httpd.init(host_alloc_plan)
        self.round += 1
        per_host: dict[str, int] = {}
        for slot in host_alloc_plan:
            per_host[slot.hostname] = per_host.get(slot.hostname, 0) + 1
        hosts = ", ".join(f"{h}[{n}]" for h, n in per_host.items())
        say(
            f"training at {len(host_alloc_plan)} rank(s) on {len(per_host)} worker(s) "
            f"(round {self.round}): {hosts}"
        )

    def stop(self) -> None:
        if self.httpd is not None:
            self.httpd.shutdown()
        if self.thread is not None:
            self.thread.join(timeout=10)


class Ranks:
    """Starting ranks through the workers' agents: Horovod's create_worker_fn."""

    def __init__(self, discovery: AgentDiscovery) -> None:
        self.discovery = discovery
        self.lock = threading.Lock()
        self.running: dict[tuple[str, int], str] = {}  # (host, slot) -> agent address

    def __call__(self, slot_info: Any, events: Sequence[threading.Event]) -> tuple[int, float]:
        from horovod.runner.gloo_run import create_slot_env_vars

        host, slot = str(slot_info.hostname), int(slot_info.local_rank)
        name = f"{host}[{slot}]"
        address = self.discovery.address_of(host)
        if address is None:
            say(f"{name}: no agent known for this host")
            return 1, time.time()
        env = {k: str(v) for k, v in create_slot_env_vars(slot_info).items()}
        try:
            status, body = request(address, "POST", f"/ranks/{slot}", {"env": env})
        except OSError as error:
            say(f"{name}: cannot reach its agent at {address}: {error}")
            return 1, time.time()
        if status != 200:
            say(f"{name}: its agent refused rank {slot_info.rank}: {body.get('error', status)}")
            return 1, time.time()
        with self.lock:
            self.running[(host, slot)] = address
        try:
            return self._wait(name, address, slot, events), time.time()
        finally:
            with self.lock:
                self.running.pop((host, slot), None)

    def _wait(self, name: str, address: str, slot: int, events: Sequence[threading.Event]) -> int:
        stop_sent = False
        lost_since: float | None = None
        while True:
            if not stop_sent and any(event.is_set() for event in events):
                stop_sent = True
                self._stop(address, slot)
            try:
                status, body = request(
                    address, "GET", f"/ranks/{slot}?wait={POLL_SECONDS}", timeout=POLL_SECONDS + 5
                )
            except OSError as error:
                lost_since = lost_since or time.monotonic()
                if time.monotonic() - lost_since > AGENT_LOST_SECONDS:
                    say(f"{name}: its agent at {address} is unreachable ({error}): rank lost")
                    return 1
                time.sleep(1)
                continue
            lost_since = None
            if status == 404:
                # Another agent answers at that name: the pod was replaced, the rank is gone.
                say(f"{name}: its agent at {address} no longer has the rank: rank lost")
                return 1
            if status == 200 and not body.get("running"):
                return int(body.get("exit_code") or 0)

    def _stop(self, address: str, slot: int) -> None:
        with contextlib.suppress(OSError):  # gone already
            request(address, "POST", f"/ranks/{slot}/stop", {})

    def stop_all(self) -> None:
        with self.lock:
            running = list(self.running.items())
        for (_, slot), address in running:
            self._stop(address, slot)


def finish(agents: Sequence[str], wait: float = FINISH_WAIT_SECONDS) -> None:
    """Tell every worker the job is over, and wait (up to `wait` s) until their agents
    have exited: the worker pods then complete before the launcher does, so that
    the job is Succeeded with its workers done, not running (cleanPodPolicy
    Running would delete them, rank 0's log with them)."""

    def one(address: str) -> None:
        with contextlib.suppress(OSError):
            request(address, "POST", "/finish", {}, timeout=2)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not probe_answers(address):
                return
            time.sleep(0.5)

    with ThreadPoolExecutor(max_workers=max(1, min(32, len(agents)))) as pool:
        list(pool.map(one, agents))


def probe_answers(address: str) -> bool:
    """Whether an agent still answers at `address` (ready or not)."""
    try:
        request(address, "GET", contract.ELASTIC_READY_PATH, timeout=PROBE_TIMEOUT_SECONDS)
    except OSError:
        return False
    return True


def read_agents(path: Path) -> list[str]:
    agents = []
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        host, _, port = line.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"line {number}: {raw!r} is not <host>:<port>")
        agents.append(line)
    if not agents:
        raise ValueError("no agents")
    return agents


def in_worker_order(discovery: AgentDiscovery) -> Callable[[Any, Sequence[str]], list[str]]:
    """Horovod's HostManager.order_available_hosts, with new hosts by worker index:
    Horovod keeps the hosts it trains on in order (rank 0 stays where it is) and
    appends new ones in a set's order, which is arbitrary. By index, rank 0
    starts on worker 0, whose log the operator reads for the first step."""

    def order(available_hosts: Any, prev_host_assignment_order: Sequence[str]) -> list[str]:
        kept = [host for host in prev_host_assignment_order if host in available_hosts]
        new = [host for host in available_hosts if host not in set(kept)]
        return kept + sorted(new, key=lambda host: (discovery.index_of(host), host))

    return order


def run(args: argparse.Namespace, agents: Sequence[str]) -> int:
    from horovod.runner.elastic.discovery import HostManager
    from horovod.runner.elastic.driver import ElasticDriver
    from horovod.runner.elastic.rendezvous import create_rendezvous_handler

    discovery = AgentDiscovery(agents)
    HostManager.order_available_hosts = staticmethod(in_worker_order(discovery))
    rendezvous = FixedPortRendezvous(args.port, discovery)
    driver = ElasticDriver(
        rendezvous,
        discovery,
        args.min_np,
        args.max_np,
        timeout=args.timeout,
        reset_limit=args.reset_limit,
        verbose=args.verbose,
    )
    ranks = Ranks(discovery)
    terminated = threading.Event()

    def on_sigterm(_signum: int, _frame: object) -> None:
        if terminated.is_set():
            return
        terminated.set()
        # The ranks decide together how to stop (with a checkpoint: preemption.py).
        threading.Thread(target=ranks.stop_all, daemon=True).start()

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        rendezvous.start(create_rendezvous_handler(driver))
    except OSError as error:
        say(f"cannot serve the rendezvous on port {args.port}: {error}")
        driver.stop()
        return 1
    say(
        f"elastic: {args.min_np} to {args.max_np} rank(s), starting at {args.np}; asking "
        f"{len(agents)} worker(s) every {DISCOVERY_SECONDS:.0f}s which can take ranks; "
        f"rendezvous on port {args.port}"
    )
    try:
        driver.wait_for_available_slots(args.np)
    except Exception as error:
        say(f"not enough workers ready to start: {error}")
        driver.stop()
        return 1
    driver.start(args.np, ranks)
    results = driver.get_results()
    driver.stop()
    finish(discovery.endpoints())
    if terminated.is_set():
        say("stopped on SIGTERM; the ranks stopped with it")
        return 128 + signal.SIGTERM
    if results.error_message is not None:
        say(results.error_message)
        return 1
    failed = sorted(
        (timestamp, name, code)
        for name, (code, timestamp) in results.worker_results.items()
        if code != 0
    )
    if failed:
        _, name, code = failed[0]
        ready = sum(discovery.find_available_hosts_and_slots().values())
        below = f"; {ready} slot(s) ready, fewer than --min-np" if ready < args.min_np else ""
        say(f"the job failed: rank {name} exited with code {code} first{below}")
        return 1
    say(f"training finished ({len(results.worker_results)} rank(s) ended well)")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m horovod_worker.elastic_launcher")
    parser.add_argument("--agents", required=True, type=Path, help="'<host>:<port>' lines")
    parser.add_argument("--np", type=int, required=True, help="ranks to start with")
    parser.add_argument("--min-np", type=int, required=True, help="fewest ranks to go on with")
    parser.add_argument("--max-np", type=int, required=True, help="most ranks to grow to")
    parser.add_argument(
        "--port", type=int, default=contract.GLOO_RENDEZVOUS_PORT, help="[%(default)s]"
    )
    parser.add_argument(
        "--timeout",
        type=int,
        default=DEFAULT_TIMEOUT_SECONDS,
        help="seconds to wait for --min-np ranks before failing [%(default)s]",
    )
    parser.add_argument("--reset-limit", type=int, default=None, help="most resets [none]")
    parser.add_argument(
        "--verbose",
        type=int,
        default=int(os.environ.get(VERBOSE_ENV) or 0),
        help=f"Horovod's driver logging, 0 to 2 [{VERBOSE_ENV} or 0]",
    )
    args = parser.parse_args(argv)
    # Horovod's driver reports through logging (a failed notification of the ranks,
    # a blacklisted host): its warnings always, its progress with --verbose.
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format=f"{PREFIX} horovod: %(levelname)s %(message)s",
        stream=sys.stdout,
    )
    if not 1 <= args.min_np <= args.np <= args.max_np:
        parser.error("need 1 <= --min-np <= --np <= --max-np")
    try:
        agents = read_agents(args.agents)
    except (OSError, ValueError) as error:
        say(f"cannot read the agents file {args.agents}: {error}")
        return 2
    return run(args, agents)


if __name__ == "__main__":
    sys.exit(main())
