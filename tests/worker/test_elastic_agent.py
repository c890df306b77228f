"""The elastic agent's HTTP contract, with a stand-in for the rank (no Horovod).

What the driver may ask and what it may not: only a rank's Horovod variables,
only for this worker's host name and a slot it has; the agent's readiness
follows SIGTERM and a rank that fails on its own; its exit code says how it
ended (horovod_worker/elastic_agent.py).
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

import horovod_contract as contract
from horovod_worker.elastic_agent import Agent, AgentPlan, plan_from_env, serve
from horovod_worker.gloo_worker import PlanError
from localcluster.poll import holds
from localcluster.processes import free_port


def request(port: int, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


class Running:
    def __init__(self, agent: Agent, port: int) -> None:
        self.agent, self.port = agent, port
        self.code: int | None = None
        self.thread = threading.Thread(target=self._wait, daemon=True)
        self.thread.start()

    def _wait(self) -> None:
        self.code = self.agent.wait_to_exit()

    def slot_env(self, slot: int = 0, **extra: str) -> dict[str, str]:
        return {
            "HOROVOD_HOSTNAME": self.agent.plan.host,
            "HOROVOD_RANK": str(slot),
            "HOROVOD_SIZE": "2",
            "HOROVOD_LOCAL_RANK": str(slot),
            **extra,
        }


@pytest.fixture
def agent() -> Iterator[Any]:
    started: list[Any] = []

    def start(script: str, slots: int = 2) -> Running:
        port = free_port()
        plan = AgentPlan("127.0.0.1", free_port(), 3, "w.svc", slots, port)
        agent = Agent(plan, ["sh", "-c", script], {"PATH": "/usr/bin:/bin"})
        # The rendezvous is this host; no server needs to answer to start a rank.
        agent.rendezvous = ("127.0.0.1", "lo")
        server = serve(agent, port)
        running = Running(agent, port)
        started.append((server, agent))
        return running

    yield start
    for server, agent in started:
        agent.terminate()
        server.shutdown()


def test_a_rank_runs_with_the_variables_asked_and_its_exit_code_comes_back(agent: Any) -> None:
    running = agent('echo "rank $HOROVOD_RANK of $HOROVOD_SIZE elastic=$HOROVOD_ELASTIC"; exit 0')
    status, ready = request(running.port, "GET", contract.ELASTIC_READY_PATH)
    assert status == 200 and ready["slots"] == 2 and ready["index"] == 3
    assert ready["host"].startswith("w-") and ":" not in ready["host"]
    assert request(running.port, "POST", "/ranks/1", {"env": running.slot_env(1)})[0] == 200
    status, done = request(running.port, "GET", "/ranks/1?wait=10")
    assert (status, done) == (200, {"running": False, "exit_code": 0})
    request(running.port, "POST", "/finish", {})
    running.thread.join(timeout=10)
    assert running.code == 0


def test_the_driver_chooses_a_rank_never_what_runs(agent: Any) -> None:
    running = agent("sleep 30")
    port = running.port
    status, body = request(port, "POST", "/ranks/0", {"env": running.slot_env(LD_PRELOAD="x.so")})
    assert status == 400 and "LD_PRELOAD" in body["error"]
    other = running.slot_env(HOROVOD_HOSTNAME="someone-else")
    assert request(port, "POST", "/ranks/0", {"env": other})[0] == 409
    assert request(port, "POST", "/ranks/5", {"env": running.slot_env(5)})[0] == 404
    wrong_slot = running.slot_env(0, HOROVOD_LOCAL_RANK="1")
    assert request(port, "POST", "/ranks/0", {"env": wrong_slot})[0] == 400
    assert request(port, "POST", "/ranks/0", {"env": "not a map"})[0] == 400
    assert request(port, "POST", "/ranks/0", {"env": running.slot_env()})[0] == 200
    # One rank per slot.
    assert request(port, "POST", "/ranks/0", {"env": running.slot_env()})[0] == 409


def test_sigterm_makes_it_unready_and_reaches_the_ranks(agent: Any) -> None:
    running = agent("trap 'exit 143' TERM; while true; do sleep 0.1; done")
    assert request(running.port, "POST", "/ranks/0", {"env": running.slot_env()})[0] == 200
    running.agent.terminate()
    assert request(running.port, "GET", contract.ELASTIC_READY_PATH)[0] == 503
    assert request(running.port, "GET", "/ranks/0?wait=10") == (
        200, {"running": False, "exit_code": 143},
    )  # fmt: skip
    running.thread.join(timeout=10)
    assert running.code == 143
    # A pod on its way out takes no new ranks.
    assert request(running.port, "POST", "/ranks/1", {"env": running.slot_env(1)})[0] == 503


def test_a_rank_failing_on_its_own_ends_the_worker_with_its_code(agent: Any) -> None:
    running = agent("sleep 0.2; exit 7")
    assert request(running.port, "POST", "/ranks/0", {"env": running.slot_env()})[0] == 200
    running.thread.join(timeout=10)
    assert running.code == 7
    assert request(running.port, "GET", contract.ELASTIC_READY_PATH)[0] == 503


def test_a_rank_stopped_by_the_driver_does_not_fail_the_worker(agent: Any) -> None:
    running = agent("trap 'exit 143' TERM; while true; do sleep 0.1; done")
    assert request(running.port, "POST", "/ranks/0", {"env": running.slot_env()})[0] == 200
    assert request(running.port, "POST", "/ranks/0/stop", {})[0] == 200
    assert request(running.port, "GET", "/ranks/0?wait=10")[1]["exit_code"] == 143
    # The worker stays up and ready for the driver's next rank.
    holds(
        lambda: (
            request(running.port, "GET", contract.ELASTIC_READY_PATH)[0] == 200
            and running.code is None
        ),
        0.6,
        message="the worker still ready, not ended",
    )


def test_the_plan_comes_from_the_operators_environment() -> None:
    env = {
        contract.ENV_GLOO_RENDEZVOUS: "j-launcher.j-worker.ns.svc:2223",
        contract.ENV_WORKER_INDEX: "2",
        contract.ENV_WORKER_HOST: "j-worker-2.j-worker.ns.svc",
        contract.ENV_SLOTS_PER_WORKER: "4",
    }
    plan = plan_from_env(env)
    assert (plan.rendezvous_host, plan.rendezvous_port, plan.index, plan.slots) == (
        "j-launcher.j-worker.ns.svc", 2223, 2, 4,
    )  # fmt: skip
    assert plan.port == contract.ELASTIC_AGENT_PORT
    assert plan.host.startswith("j-worker-2-")
    with pytest.raises(PlanError, match=contract.ENV_WORKER_INDEX):
        plan_from_env({k: v for k, v in env.items() if k != contract.ENV_WORKER_INDEX})
    with pytest.raises(PlanError, match="non-negative integer"):
        plan_from_env({**env, contract.ENV_SLOTS_PER_WORKER: "two"})
