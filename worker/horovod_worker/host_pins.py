"""The launcher's ssh connects to each worker at the address its name had at the start.

mpirun starts its daemons with ``ssh <worker name> orted ...``; each ssh resolves the
name itself, once, with no retry: a cluster DNS that answers late or not at all
for a moment (``Temporary failure in name resolution``) fails the whole launch,
even after horovodrun's own ssh check of the same name passed a second earlier
(a CI run of 2026-12-06 on a loaded node). A static job's workers keep their
addresses for the whole attempt (a worker that goes means a new attempt, with a
new launcher), so the launcher resolves every worker once, patiently, before
horovodrun starts, and its ssh config says ``HostName <address>`` for each: no
ssh of the job asks the DNS again. Host keys are still checked: the job's
known_hosts line matches any host name or address.

Elastic jobs are left to the DNS: their workers come and go under the same names.
A name that does not resolve within the wait is left to ssh as well, which then
reports it as before.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Final

# How long one worker's name may take to resolve (a new headless Service's records
# can come seconds after its pods are Ready).
WAIT_S: Final = 60.0
FIRST_PAUSE_S: Final = 0.1
MAX_PAUSE_S: Final = 2.0
THREADS: Final = 32

Resolver = Callable[[str], str]


def resolve(host: str) -> str:
    """The name's first address, IPv4 first (what ssh would connect to)."""
    infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    infos.sort(key=lambda info: info[0] != socket.AF_INET)
    return str(infos[0][4][0])


def resolve_patiently(
    host: str,
    resolver: Resolver | None = None,
    wait: float = WAIT_S,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> str | None:
    """The address, asking again after each failure until `wait` is over; None then."""
    ask = resolver or resolve
    deadline = clock() + wait
    pause = FIRST_PAUSE_S
    while True:
        try:
            return ask(host)
        except (OSError, UnicodeError):
            if clock() + pause > deadline:
                return None
            sleep(pause)
            pause = min(MAX_PAUSE_S, pause * 2)


def pin(
    hosts: Iterable[str], resolver: Resolver | None = None, wait: float = WAIT_S
) -> dict[str, str]:
    """Each name that resolved within `wait`, with its address (in parallel)."""
    names = list(dict.fromkeys(h for h in hosts if h and h != "localhost"))
    if not names:
        return {}
    with ThreadPoolExecutor(max_workers=min(THREADS, len(names))) as pool:
        found = list(pool.map(lambda h: resolve_patiently(h, resolver, wait), names))
    return {name: address for name, address in zip(names, found, strict=True) if address}


def render(pins: dict[str, str]) -> list[str]:
    """ssh_config lines that go before ``Host *`` (ssh takes an option's first value)."""
    lines: list[str] = []
    for name, address in pins.items():
        lines += [f"Host {name}", f"    HostName {address}"]
    return lines


def is_static_horovodrun(args: Iterable[str]) -> bool:
    """Whether horovodrun's arguments start a static run (no host discovery)."""
    return not any(a.startswith("--host-discovery-script") for a in args)
