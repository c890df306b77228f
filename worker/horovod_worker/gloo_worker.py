"""A worker pod's main process in launchMode: gloo: start this pod's ranks, no ssh.

``python -m horovod_worker.gloo_worker -- COMMAND ...`` reads its place in the
job from the environment the operator sets (contract.ENV_*: the launcher's
rendezvous address, this worker's index and host name, the worker and slot
counts), then:

1. waits until the launcher's rendezvous server accepts connections (it starts
   after the workers; a rank started before it fails at once), printing what it
   waits for, and gives up with a clear message after the timeout;
2. starts slotsPerWorker copies of COMMAND, each with the environment horovodrun
   would give it (Horovod's HOROVOD_RANK, _SIZE, _LOCAL_RANK, ... and the Gloo
   rendezvous variables), in its own process group;
3. copies their output to its own, each line tagged ``[rank]<stdout>:`` as
   horovodrun --gloo tags it (horovod_contract.rank_output reads it back);
4. forwards SIGTERM and SIGINT to every rank; when a rank fails, stops the
   others (Horovod cannot go on without it);
5. reports its result to the launcher (which ends once every worker has), and
   exits with the first non-zero rank exit code, or 0.

The pod's exit code is what the operator reads: a failed rank's worker pod
fails with that rank's code and its last log lines as the termination message.
Standard library only, so that it runs in any image that has Horovod.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import IO

import horovod_contract as contract

from .gloo_launcher import DONE_SCOPE

PREFIX = "gloo_worker:"
# How long the other ranks have after one failed (SIGTERM) before SIGKILL.
STOP_GRACE_SECONDS = 10.0
# How often a waiting worker says what it waits for.
WAIT_REPORT_SECONDS = 10.0
DEFAULT_TIMEOUT_SECONDS = 1200.0
# Reporting the result to the launcher: attempts and the pause between them.
REPORT_ATTEMPTS = 5
REPORT_PAUSE_SECONDS = 1.0
SIOCGIFADDR = 0x8915


class PlanError(ValueError):
    """The environment does not describe a place in a job; the message says what is wrong."""


@dataclass(frozen=True)
class Plan:
    """This worker's place in the job, as the operator described it."""

    rendezvous_host: str
    rendezvous_port: int
    timeout: float
    index: int
    host: str
    workers: int
    slots: int

    @property
    def size(self) -> int:
        return self.workers * self.slots

    def rank(self, slot: int) -> int:
        return self.index * self.slots + slot


def _int(env: Mapping[str, str], name: str, minimum: int) -> int:
    text = env.get(name, "")
    try:
        value = int(text)
    except ValueError:
        raise PlanError(f"{name} must be an integer, got {text!r}") from None
    if value < minimum:
        raise PlanError(f"{name} must be at least {minimum}, got {value}")
    return value


def require_env(env: Mapping[str, str], names: Sequence[str], jobs: str) -> None:
    """PlanError naming every variable of `names` that `env` lacks (`jobs`: which
    HorovodJobs' pods get them from the operator)."""
    missing = [name for name in names if not env.get(name)]
    if missing:
        raise PlanError(
            f"{', '.join(missing)} not set: this runs in the worker pods of a HorovodJob "
            f"with {jobs}, whose operator sets them"
        )


def rendezvous_address(env: Mapping[str, str]) -> tuple[str, int]:
    """contract.ENV_GLOO_RENDEZVOUS as (host, port); PlanError when it is not that."""
    address = env[contract.ENV_GLOO_RENDEZVOUS]
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise PlanError(f"{contract.ENV_GLOO_RENDEZVOUS} must be <host>:<port>, got {address!r}")
    return host, int(port)


def plan_from_env(env: Mapping[str, str]) -> Plan:
    """The plan from contract.ENV_* (PlanError names a missing or bad variable)."""
    names = (
        contract.ENV_GLOO_RENDEZVOUS,
        contract.ENV_WORKER_INDEX,
        contract.ENV_WORKER_HOST,
        contract.ENV_WORKER_COUNT,
        contract.ENV_SLOTS_PER_WORKER,
    )
    require_env(env, names, "launchMode: gloo")
    host, port = rendezvous_address(env)
    timeout_text = env.get(contract.ENV_GLOO_RENDEZVOUS_TIMEOUT) or str(DEFAULT_TIMEOUT_SECONDS)
    try:
        timeout = float(timeout_text)
    except ValueError:
        raise PlanError(
            f"{contract.ENV_GLOO_RENDEZVOUS_TIMEOUT} must be a number of seconds, "
            f"got {timeout_text!r}"
        ) from None
    plan = Plan(
        rendezvous_host=host,
        rendezvous_port=port,
        timeout=timeout,
        index=_int(env, contract.ENV_WORKER_INDEX, 0),
        host=env[contract.ENV_WORKER_HOST],
        workers=_int(env, contract.ENV_WORKER_COUNT, 1),
        slots=_int(env, contract.ENV_SLOTS_PER_WORKER, 1),
    )
    if plan.index >= plan.workers:
        raise PlanError(
            f"{contract.ENV_WORKER_INDEX}={plan.index} is not below "
            f"{contract.ENV_WORKER_COUNT}={plan.workers}"
        )
    return plan


def rank_env(plan: Plan, slot: int) -> dict[str, str]:
    """What horovodrun --gloo gives the rank in `slot` of this worker (gloo_run's
    create_slot_env_vars): workers are Horovod's hosts, in index order, each
    with the same slot count, so a rank's cross rank is its worker's index."""
    return {
        "HOROVOD_HOSTNAME": plan.host,
        "HOROVOD_RANK": str(plan.rank(slot)),
        "HOROVOD_SIZE": str(plan.size),
        "HOROVOD_LOCAL_RANK": str(slot),
        "HOROVOD_LOCAL_SIZE": str(plan.slots),
        "HOROVOD_CROSS_RANK": str(plan.index),
        "HOROVOD_CROSS_SIZE": str(plan.workers),
    }


def rendezvous_env(address: str, port: int, iface: str) -> dict[str, str]:
    """What horovodrun --gloo gives every rank (gloo_run's create_run_env_vars)."""
    return {
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": address,
        "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port),
        "HOROVOD_CONTROLLER": "gloo",
        "HOROVOD_CPU_OPERATIONS": "gloo",
        "HOROVOD_GLOO_IFACE": iface,
        "NCCL_SOCKET_IFNAME": iface,
        "PYTHONUNBUFFERED": "1",
    }


def say(message: str) -> None:
    print(f"{PREFIX} {message}", file=sys.stderr, flush=True)


def wait_for_rendezvous(
    plan: Plan,
    clock: Callable[[], float] = time.monotonic,
    pause: Callable[[float], None] = time.sleep,
) -> str:
    """The rendezvous server's IPv4 address, once it accepts a connection.

    Ranks connect to the address Horovod is given; resolving it here also waits
    for the launcher's DNS name, which exists only once the launcher pod does.
    Raises TimeoutError naming the address and the last error after plan.timeout.
    """
    target = f"{plan.rendezvous_host}:{plan.rendezvous_port}"
    started = clock()
    next_report = started
    while True:
        try:
            infos = socket.getaddrinfo(
                plan.rendezvous_host, plan.rendezvous_port, socket.AF_INET, socket.SOCK_STREAM
            )
            address = str(infos[0][4][0])
            with socket.create_connection((address, plan.rendezvous_port), timeout=2):
                return address
        except OSError as error:
            problem = str(error) or type(error).__name__
        now = clock()
        waited = now - started
        if waited >= plan.timeout:
            raise TimeoutError(
                f"the rendezvous server at {target} (the launcher pod) did not answer within "
                f"{plan.timeout:.0f}s ({contract.ENV_GLOO_RENDEZVOUS_TIMEOUT}); last error: "
                f"{problem}. Check the launcher pod's status and log"
            )
        if now >= next_report:
            say(f"waiting for the rendezvous server at {target} ({waited:.0f}s): {problem}")
            next_report = now + WAIT_REPORT_SECONDS
        pause(0.5)


def interface_of(address: str) -> str | None:
    """The name of the local interface that holds `address`, if any (Linux)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            request = struct.pack("256s", name.encode()[:15])
            try:
                reply = fcntl.ioctl(probe.fileno(), SIOCGIFADDR, request)
            except OSError:
                continue  # no IPv4 address
            if socket.inet_ntoa(reply[20:24]) == address:
                return name
    return None


def route_interface(remote: str, port: int) -> str:
    """The interface this pod reaches `remote` through (eth0 in most pods), which
    Gloo must bind: horovodrun picks it the same way, from the launcher's view."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((remote, port))  # UDP: picks a route, sends nothing
        local = str(probe.getsockname()[0])
    found = interface_of(local)
    if found is None:
        raise OSError(f"no interface holds {local}, this pod's address towards {remote}")
    return found


def exit_code_of(returncode: int) -> int:
    """Popen's returncode (negative for a signal) as a shell reports it (128 + signal)."""
    return 128 - returncode if returncode < 0 else returncode


def spawn(command: Sequence[str], env: Mapping[str, str]) -> subprocess.Popen[bytes]:
    """One rank process, in a process group of its own (signals reach its children)."""
    return subprocess.Popen(
        list(command),
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


class TaggedOutput:
    """Copies rank processes' output to this process's own, each line tagged
    ``[rank]<stdout>:`` (or ``<stderr>``) as horovodrun --gloo tags it; lines of
    different ranks never interleave."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pumps: list[threading.Thread] = []

    def follow(self, rank: int, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None and proc.stderr is not None
        for stream, name, sink in (
            (proc.stdout, "stdout", sys.stdout.buffer),
            (proc.stderr, "stderr", sys.stderr.buffer),
        ):
            pump = threading.Thread(target=self._pump, args=(rank, name, stream, sink), daemon=True)
            pump.start()
            self._pumps.append(pump)

    def join(self, timeout: float = 5) -> None:
        for pump in self._pumps:
            pump.join(timeout=timeout)

    def _pump(self, rank: int, name: str, stream: IO[bytes], sink: IO[bytes]) -> None:
        tag = f"[{rank}]<{name}>:".encode()
        for line in iter(stream.readline, b""):
            if not line.endswith(b"\n"):
                line += b"\n"
            with self._lock:
                sys.stdout.flush()
                sys.stderr.flush()
                sink.write(tag + line)
                sink.flush()


def signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    """Signal a rank's whole process group, if it still runs."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)


class Ranks:
    """This worker's rank processes: started, their output tagged, signalled, awaited."""

    def __init__(self, plan: Plan, command: Sequence[str], env: Mapping[str, str]) -> None:
        self.plan = plan
        self.command = list(command)
        self.env = dict(env)
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self._output = TaggedOutput()

    def start(self) -> None:
        for slot in range(self.plan.slots):
            rank = self.plan.rank(slot)
            proc = spawn(self.command, {**self.env, **rank_env(self.plan, slot)})
            self.procs[rank] = proc
            self._output.follow(rank, proc)

    def signal(self, sig: int) -> None:
        for proc in self.procs.values():
            signal_group(proc, sig)

    def wait(self) -> int:
        """Wait for every rank; returns the first non-zero exit code, or 0. A rank
        failing stops the others."""
        first: tuple[int, int] | None = None
        stop_at: float | None = None
        while True:
            running = False
            for rank, proc in self.procs.items():
                code = proc.poll()
                if code is None:
                    running = True
                elif code != 0 and first is None:
                    first = (rank, exit_code_of(code))
                    if stop_at is None:
                        others = sum(1 for p in self.procs.values() if p.poll() is None)
                        say(
                            f"rank {rank} exited with code {first[1]}; stopping the "
                            f"{others} other rank(s) of this worker"
                        )
            if not running:
                break
            # A rank failed: the others stop (SIGKILL after a grace). A SIGTERM to
            # the pod was forwarded already: the ranks take what the kubelet
            # gives (terminationGracePeriodSeconds) to write their checkpoint.
            if stop_at is None and first is not None:
                self.signal(signal.SIGTERM)
                stop_at = time.monotonic() + STOP_GRACE_SECONDS
            elif stop_at is not None and time.monotonic() > stop_at:
                self.signal(signal.SIGKILL)
            time.sleep(0.1)
        self._output.join()
        if first is not None:
            return first[1]
        codes = [exit_code_of(p.returncode) for p in self.procs.values() if p.returncode]
        return codes[0] if codes else 0


def report(address: str, plan: Plan, code: int) -> None:
    """Tell the launcher this worker is done (best effort: the operator reads the
    result from this pod's exit code, the launcher only needs to know when to end)."""
    url = f"http://{address}:{plan.rendezvous_port}/{DONE_SCOPE}/{plan.index}"
    problem = ""
    for _ in range(REPORT_ATTEMPTS):
        request = urllib.request.Request(url, data=str(code).encode(), method="PUT")
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                if response.status == 200:
                    return
                problem = f"HTTP {response.status}"
        except OSError as error:
            problem = str(error)
        time.sleep(REPORT_PAUSE_SECONDS)
    say(f"could not report to the launcher at {address} ({problem}): it ended, or is unreachable")


def run(plan: Plan, command: Sequence[str], env: Mapping[str, str]) -> int:
    stopping = threading.Event()
    ranks: Ranks | None = None

    def forward(signum: int, _frame: object) -> None:
        if ranks is None:
            raise SystemExit(128 + signum)  # nothing started yet: stop waiting
        stopping.set()
        ranks.signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    first, last = plan.rank(0), plan.rank(plan.slots - 1)
    say(
        f"worker {plan.index} of {plan.workers} ({plan.host}): ranks {first}..{last} of "
        f"{plan.size}; rendezvous at {plan.rendezvous_host}:{plan.rendezvous_port}"
    )
    try:
        address = wait_for_rendezvous(plan)
        iface = route_interface(address, plan.rendezvous_port)
    except (TimeoutError, OSError) as error:
        say(str(error))
        return 1
    say(f"rendezvous at {address}:{plan.rendezvous_port} answers; Gloo binds {iface}")
    ranks = Ranks(plan, command, {**env, **rendezvous_env(address, plan.rendezvous_port, iface)})
    try:
        ranks.start()
    except OSError as error:
        say(f"cannot start {command[0]!r}: {error}")
        ranks.signal(signal.SIGKILL)
        return 127 if isinstance(error, FileNotFoundError) else 126
    code = ranks.wait()
    say(
        f"worker {plan.index}: every rank ended; exit code {code}"
        + ("" if code == 0 else " (the first rank to fail)")
    )
    if not stopping.is_set():
        report(address, plan, code)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--"]:
        args = args[1:]
    if not args or args[0].startswith("-"):
        say("usage: python -m horovod_worker.gloo_worker -- COMMAND [ARG ...]")
        return 2
    try:
        plan = plan_from_env(os.environ)
    except PlanError as error:
        say(str(error))
        return 2
    return run(plan, args, os.environ)


if __name__ == "__main__":
    sys.exit(main())
