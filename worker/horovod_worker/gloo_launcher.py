"""The launcher of a launchMode: gloo job: Horovod's Gloo rendezvous, and nothing else.

``python -m horovod_worker.gloo_launcher --hostfile FILE --port PORT`` reads the
hosts and slots (``<host> slots=<n>`` lines, the file the operator also writes
for horovodrun), and serves Horovod's own rendezvous server
(horovod.runner.http.http_server, what horovodrun --gloo starts) for that plan
on PORT. It starts no process: each worker pod starts its own ranks
(horovod_worker.gloo_worker), and they find each other through this server.

Each worker reports here when its ranks have ended (PUT
/<DONE_SCOPE>/<worker index>, the exit code as the body). The
launcher logs every report and exits 0 once every worker has reported, or as
soon as one reports a failure: the rendezvous has nothing left to serve then.
The job's result is not the launcher's: the operator reads it from the worker
pods' exit codes, which name the pod whose rank failed. A non-zero exit here
means the rendezvous itself failed (an unreadable hostfile, a port in use).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import horovod_contract as contract

PREFIX = "gloo_launcher:"
# Where a gloo worker reports that its ranks ended: PUT /<scope>/<worker index>
# with the exit code as the body (an ad-hoc scope of Horovod's key-value store,
# which the rendezvous itself never uses).
DONE_SCOPE = "hvjob-done"
POLL_SECONDS = 0.2


def say(message: str) -> None:
    print(f"{PREFIX} {message}", flush=True)


def parse_hostfile(text: str) -> list[tuple[str, int]]:
    """(host, slots) per `<host> slots=<n>` line; blank lines and # comments are skipped."""
    hosts = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        slots = 1
        for part in parts[1:]:
            key, _, value = part.partition("=")
            if key == "slots" and value.isdigit() and int(value) > 0:
                slots = int(value)
            else:
                raise ValueError(f"line {number}: {raw!r} is not '<host> slots=<n>'")
        hosts.append((parts[0], slots))
    if not hosts:
        raise ValueError("no hosts")
    return hosts


def host_plan(hosts: Sequence[tuple[str, int]]) -> list[Any]:
    """Horovod's slot assignment (SlotInfo per rank), as horovodrun makes it."""
    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts

    total = sum(slots for _, slots in hosts)
    return list(get_host_assignments(parse_hosts(",".join(f"{h}:{s}" for h, s in hosts)), total))


def done_reports(server: Any) -> dict[int, int]:
    """The workers' reports so far: worker index -> exit code."""
    with server.cache_lock:
        raw = dict(server.cache.get(DONE_SCOPE, {}))
    reports = {}
    for key, value in raw.items():
        try:
            reports[int(key)] = int(value)
        except ValueError:
            say(f"ignored a report that is not '<index>' -> '<exit code>': {key!r} -> {value!r}")
    return reports


def serve(hosts: Sequence[tuple[str, int]], port: int) -> int:
    from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer

    plan = host_plan(hosts)
    # Listening from here on; init() before serving, so that no rank ever reads
    # a store without its plan.
    server = RendezvousHTTPServer(("", port), RendezvousHandler, False)
    server.init(plan)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    first = 0
    for host, slots in hosts:
        say(f"  {host}: ranks {first}..{first + slots - 1}")
        first += slots
    say(f"serving the Gloo rendezvous on port {port}: {len(plan)} rank(s), {len(hosts)} host(s)")
    seen: dict[int, int] = {}
    while len(seen) < len(hosts):
        for index, code in sorted(done_reports(server).items()):
            if index in seen:
                continue
            seen[index] = code
            host = hosts[index][0] if 0 <= index < len(hosts) else f"worker {index}"
            say(f"worker {index} ({host}) finished with exit code {code}")
            if code != 0:
                say(
                    f"worker {index} failed; the rendezvous ends here (the job's status names "
                    "the failed worker pod and its exit code)"
                )
                server.shutdown()
                return 0
        time.sleep(POLL_SECONDS)
    say(f"every worker finished successfully ({len(hosts)})")
    server.shutdown()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m horovod_worker.gloo_launcher")
    parser.add_argument("--hostfile", required=True, type=Path, help="'<host> slots=<n>' lines")
    parser.add_argument(
        "--port", type=int, default=contract.GLOO_RENDEZVOUS_PORT, help="[%(default)s]"
    )
    args = parser.parse_args(argv)
    # The operator deletes the launcher when an attempt ends early: end at once.
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    try:
        hosts = parse_hostfile(args.hostfile.read_text())
    except (OSError, ValueError) as error:
        say(f"cannot read the hostfile {args.hostfile}: {error}")
        return 2
    try:
        return serve(hosts, args.port)
    except OSError as error:
        say(f"cannot serve the rendezvous on port {args.port}: {error}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
