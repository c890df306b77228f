"""The launcher's ssh reaches each worker at the address its name had at the start
(horovod_worker.host_pins): a DNS that fails for a moment fails no launch."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from horovod_worker import host_pins, sshd
from tests.support.ssh import loopback_sshd


class FlakyDns:
    """Fails `failures` times (EAI_AGAIN, as a loaded cluster DNS does), then answers."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.asked = 0

    def __call__(self, host: str) -> str:
        self.asked += 1
        if self.asked <= self.failures:
            raise OSError(-3, "Temporary failure in name resolution")
        return "10.0.0.7"


def test_a_name_that_fails_for_a_moment_is_asked_again() -> None:
    dns, slept = FlakyDns(3), list[float]()
    found = host_pins.resolve_patiently("w-0", dns, wait=60, sleep=slept.append)
    assert found == "10.0.0.7" and dns.asked == 4
    assert slept == [0.1, 0.2, 0.4]  # backing off


def test_a_name_that_never_resolves_is_given_up_after_the_wait() -> None:
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    found = host_pins.resolve_patiently(
        "w-0", FlakyDns(10**6), wait=10, sleep=sleep, clock=lambda: now[0]
    )
    assert found is None and now[0] <= 10


def test_pins_are_each_worker_once_and_go_before_the_catch_all() -> None:
    pins = host_pins.pin(
        ["w-0.s.ns.svc", "w-1.s.ns.svc", "w-0.s.ns.svc", "localhost"],
        lambda h: "10.0.0.7" if h.startswith("w-0") else "10.0.0.8",
    )
    assert pins == {"w-0.s.ns.svc": "10.0.0.7", "w-1.s.ns.svc": "10.0.0.8"}
    text = sshd.render_ssh_config(Path("/k"), 2222, True, pins)
    assert text.index("Host w-0.s.ns.svc\n    HostName 10.0.0.7") < text.index("Host *")
    assert host_pins.is_static_horovodrun(["-np", "2", "--hostfile", "/h", "python", "t.py"])
    assert not host_pins.is_static_horovodrun(["--host-discovery-script=/d", "python", "t.py"])


def test_only_a_static_horovodrun_of_ours_is_pinned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("w-0.s.ns.svc slots=1\nlocalhost slots=1\n")
    monkeypatch.setattr(host_pins, "resolve", lambda host: "10.0.0.7")
    monkeypatch.setattr(sshd, "is_our_horovodrun", lambda command: command[0] == "python")
    ours = ["python", "-m", "horovod_worker.horovodrun", "--hostfile", str(hostfile), "python"]
    assert sshd.pinned_workers(ours) == {"w-0.s.ns.svc": "10.0.0.7"}  # never localhost
    assert sshd.pinned_workers(["mpirun", "--hostfile", str(hostfile), "python", "t.py"]) == {}
    assert sshd.pinned_workers([*ours[:3], "--host-discovery-script", "/d", "python"]) == {}


def test_a_pinned_worker_is_reached_at_its_address_without_the_dns(tmp_path: Path) -> None:
    with loopback_sshd(tmp_path) as server:
        private = tmp_path / "client"
        verify = sshd.install_keys(server.secret, private)
        # .invalid never resolves (RFC 2606): only the pin can lead there.
        config = sshd.install_client_config(
            private, server.port, server.home, verify, {"w-0.pinned.invalid": "127.0.0.1"}
        )

        def ssh(host: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                ["ssh", "-F", str(config), f"{server.user}@{host}", "echo reached"],
                env=server.env, capture_output=True, text=True, timeout=30,
            )  # fmt: skip

        pinned = ssh("w-0.pinned.invalid")
        assert pinned.returncode == 0 and pinned.stdout.strip() == "reached", pinned.stderr
        unpinned = ssh("w-1.pinned.invalid")
        assert unpinned.returncode != 0
        assert "Could not resolve hostname" in unpinned.stderr, unpinned.stderr
