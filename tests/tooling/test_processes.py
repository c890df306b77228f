"""localcluster.processes: the machine-wide lock on a fixed port."""

from __future__ import annotations

import subprocess
import sys
import time

from localcluster.paths import REPO
from localcluster.processes import free_port, port_held

HOLDER = """
import sys, time
from localcluster.processes import port_held
with port_held(int(sys.argv[1])):
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
print("released", flush=True)
"""


def test_a_second_holder_of_a_fixed_port_waits_for_the_first() -> None:
    port = free_port()
    first = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(port), "1.5"], cwd=REPO, stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    assert first.stdout is not None and first.stdout.readline() == "held\n"
    began = time.monotonic()
    with port_held(port):
        waited = time.monotonic() - began
        # The first holder let go before this one got the lock.
        assert first.wait(timeout=10) == 0
    assert first.stdout.read() == "released\n"
    assert waited > 0.5, waited
