"""The elastic launcher's host discovery and host order, with stand-in agents.

Discovery asks every possible worker and keeps only those that answer ready;
answers are reused within the interval (Horovod's driver asks every second);
changes are said in the launcher's log. New hosts are ordered by worker index
and hosts already training keep their place, so that rank 0 starts on worker 0
and stays where it is.
"""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest

from tests.support.prerequisites import require_module

# Before the imports below: horovod_worker.elastic_launcher imports Horovod.
require_module("horovod.runner")

from horovod_worker.elastic_agent import Agent, AgentPlan, serve
from horovod_worker.elastic_launcher import (
    AgentDiscovery,
    Slow,
    Worker,
    in_worker_order,
    probe,
    probe_answers,
    read_agents,
    request,
)
from localcluster.processes import free_port


def test_only_workers_that_answer_ready_are_hosts_and_answers_are_reused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    answering = {
        "w0:1": Worker("w0-aa", 1, 0, "w0:1"),
        "w2:1": Worker("w2-cc", 2, 2, "w2:1"),
    }
    asked: list[str] = []
    now = [0.0]

    def ask(address: str, last_ip: str | None) -> Worker | None:
        asked.append(address)
        return answering.get(address)

    discovery = AgentDiscovery(
        ["w0:1", "w1:1", "w2:1"], ask=ask, interval=2.0, clock=lambda: now[0]
    )
    assert discovery.find_available_hosts_and_slots() == {"w0-aa": 1, "w2-cc": 2}
    assert "2 worker(s) ready; new: worker 0 (w0-aa), worker 2 (w2-cc)" in capsys.readouterr().out
    assert len(asked) == 3
    now[0] = 1.0
    discovery.find_available_hosts_and_slots()
    assert len(asked) == 3  # within the interval: the last answers
    del answering["w2:1"]
    answering["w1:1"] = Worker("w1-bb", 1, 1, "w1:1")
    now[0] = 2.5
    assert discovery.find_available_hosts_and_slots() == {"w0-aa": 1, "w1-bb": 1}
    said = capsys.readouterr().out
    assert "new: worker 1 (w1-bb)" in said and "gone: worker 2 (w2-cc)" in said
    # A host seen once keeps its address (its rank is stopped through it).
    assert discovery.address_of("w2-cc") == "w2:1" and discovery.address_of("nobody") is None


def test_new_hosts_go_in_worker_order_and_training_hosts_keep_their_place() -> None:
    workers = [Worker(f"w{i}-x", 1, i, f"w{i}:1") for i in (10, 2, 0)]
    discovery = AgentDiscovery([w.address for w in workers], ask=lambda a, ip: None)
    discovery.known = {w.host: w for w in workers}
    order = in_worker_order(discovery)
    assert order({"w10-x", "w2-x", "w0-x"}, []) == ["w0-x", "w2-x", "w10-x"]
    # w2 was rank 0 (worker 0 was lost before): it stays first.
    assert order({"w0-x", "w2-x", "w10-x"}, ["w2-x", "w10-x"]) == ["w2-x", "w10-x", "w0-x"]


def test_the_agents_file_names_each_worker_once_per_line(tmp_path: Path) -> None:
    path = tmp_path / "agents"
    path.write_text(
        "# workers\nj-worker-0.j-worker.ns.svc:2224\n\nj-worker-1.j-worker.ns.svc:2224\n"
    )
    assert read_agents(path) == [
        "j-worker-0.j-worker.ns.svc:2224",
        "j-worker-1.j-worker.ns.svc:2224",
    ]
    path.write_text("j-worker-0\n")
    with pytest.raises(ValueError, match="line 1"):
        read_agents(path)
    path.write_text("")
    with pytest.raises(ValueError, match="no agents"):
        read_agents(path)


def test_a_ready_worker_that_answers_late_stays_a_host_for_a_few_rounds() -> None:
    worker = Worker("w0-aa", 1, 0, "w0:1")
    answers: list[Worker | type[Slow] | None] = [worker, Slow, Slow, Slow, Slow, worker, None]
    now = [0.0]

    def ask(address: str, last_ip: str | None) -> Worker | None:
        answer = answers.pop(0)
        if answer is Slow:
            raise Slow("timed out")
        assert answer is None or isinstance(answer, Worker)
        return answer

    discovery = AgentDiscovery(["w0:1"], ask=ask, interval=1.0, clock=lambda: now[0])

    def look() -> dict[str, int]:
        now[0] += 1.0
        return discovery.find_available_hosts_and_slots()

    assert look() == {"w0-aa": 1}
    # Late three times: still a host (a dropped host resets every rank).
    assert [look(), look(), look()] == [{"w0-aa": 1}] * 3
    assert look() == {}  # the fourth: gone
    assert look() == {"w0-aa": 1}
    assert look() == {}  # "not ready" (or refused): gone at once


def test_a_worker_whose_name_stops_resolving_is_asked_at_the_ip_it_had() -> None:
    port = free_port()
    plan = AgentPlan("127.0.0.1", free_port(), 0, "w0.svc", 1, port)
    agent = Agent(plan, ["true"], {})
    server = serve(agent, port)
    try:
        # A name the resolver does not know (.invalid never resolves): gone...
        address = f"w0.cluster-dns-is-down.invalid:{port}"
        assert probe(address) is None
        # ...unless the worker was Ready before: then at its IP, where it still is.
        found = probe(address, last_ip="127.0.0.1")
        assert found is not None and found.host == plan.host
        assert found.endpoint == f"127.0.0.1:{port}"
        agent.terminate()
        assert probe(address, last_ip="127.0.0.1") is None  # it says 503: not ready
    finally:
        server.shutdown()


def test_an_agent_that_hangs_up_inside_its_503_is_not_answering() -> None:
    """An agent exiting as it answers sends the 503's head and not its body (CI saw
    IncompleteRead escape the launcher's /finish wait and fail the job)."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def answer_cut_short() -> None:
        for _ in range(3):
            conn, _ = listener.accept()
            with conn:
                conn.recv(4096)
                conn.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 16\r\n\r\n")

    server = threading.Thread(target=answer_cut_short, daemon=True)
    server.start()
    try:
        with pytest.raises(OSError, match="no complete answer"):
            request(f"127.0.0.1:{port}", "GET", "/ready")
        assert probe_answers(f"127.0.0.1:{port}") is False
        assert probe(f"127.0.0.1:{port}") is None
    finally:
        server.join(timeout=10)
        listener.close()
