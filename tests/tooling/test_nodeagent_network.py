"""The node agent's pod addresses: fresh ones first, a released one only once none is left."""

from __future__ import annotations

import subprocess

import pytest

from localcluster.nodeagent import netns


def test_a_released_address_is_taken_again_only_when_the_subnet_has_no_fresh_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(["ip", *args], 0, "", "")

    monkeypatch.setattr(netns, "ip", no_ip)  # no namespaces made: the bookkeeping only
    network = netns.Network("t", "10.9.0.0/29")  # the gateway and 5 pod addresses
    first = [network.add_pod() for _ in range(2)]
    network.remove_pod(*first[0])
    assert network.add_pod()[1] == "10.9.0.4"  # not 10.9.0.2, just released
    network.remove_pod(*first[1])
    assert [network.add_pod()[1] for _ in range(2)] == ["10.9.0.5", "10.9.0.6"]
    # The subnet used up: the released ones come back, the longest released first.
    assert [network.add_pod()[1] for _ in range(2)] == ["10.9.0.2", "10.9.0.3"]
