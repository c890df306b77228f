"""launchMode: gloo on the worker side: the plan from the operator's environment,
each rank's Horovod environment, the launcher's hostfile."""

from __future__ import annotations

import pytest

import horovod_contract as contract
from horovod_worker.gloo_launcher import parse_hostfile
from horovod_worker.gloo_worker import Plan, PlanError, plan_from_env, rank_env
from tests.support.prerequisites import require_module


def env(**overrides: str) -> dict[str, str]:
    return {
        contract.ENV_GLOO_RENDEZVOUS: "j-launcher.j-worker.ns.svc:2223",
        contract.ENV_GLOO_RENDEZVOUS_TIMEOUT: "90",
        contract.ENV_WORKER_INDEX: "1",
        contract.ENV_WORKER_HOST: "j-worker-1.j-worker.ns.svc",
        contract.ENV_WORKER_COUNT: "3",
        contract.ENV_SLOTS_PER_WORKER: "2",
        **overrides,
    }


def test_plan_from_the_operators_environment() -> None:
    assert plan_from_env(env()) == Plan(
        rendezvous_host="j-launcher.j-worker.ns.svc",
        rendezvous_port=2223,
        timeout=90.0,
        index=1,
        host="j-worker-1.j-worker.ns.svc",
        workers=3,
        slots=2,
    )


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({contract.ENV_WORKER_INDEX: ""}, "HVJOB_WORKER_INDEX not set"),
        ({contract.ENV_GLOO_RENDEZVOUS: "nohost"}, "must be <host>:<port>"),
        ({contract.ENV_WORKER_INDEX: "3"}, "HVJOB_WORKER_INDEX=3 is not below"),
        ({contract.ENV_SLOTS_PER_WORKER: "0"}, "HVJOB_SLOTS_PER_WORKER must be at least 1"),
        ({contract.ENV_GLOO_RENDEZVOUS_TIMEOUT: "soon"}, "must be a number of seconds"),
    ],
)
def test_a_bad_plan_names_the_variable(overrides: dict[str, str], message: str) -> None:
    with pytest.raises(PlanError, match=message):
        plan_from_env(env(**overrides))


def test_rank_env_of_each_slot() -> None:
    plan = plan_from_env(env())
    assert [rank_env(plan, slot) for slot in range(2)] == [
        {
            "HOROVOD_HOSTNAME": "j-worker-1.j-worker.ns.svc",
            "HOROVOD_RANK": str(rank),
            "HOROVOD_SIZE": "6",
            "HOROVOD_LOCAL_RANK": str(slot),
            "HOROVOD_LOCAL_SIZE": "2",
            "HOROVOD_CROSS_RANK": "1",
            "HOROVOD_CROSS_SIZE": "3",
        }
        for slot, rank in ((0, 2), (1, 3))
    ]


@pytest.mark.parametrize(("workers", "slots"), [(1, 1), (2, 1), (2, 2), (3, 4)])
def test_rank_env_is_what_horovodrun_assigns(workers: int, slots: int) -> None:
    """The same ranks as Horovod's own assignment for the launcher's plan, which is
    what the rendezvous server expects of them."""
    hosts = require_module("horovod.runner.common.util.hosts")
    names = [f"w{i}" for i in range(workers)]
    plan = hosts.get_host_assignments(
        hosts.parse_hosts(",".join(f"{n}:{slots}" for n in names)), workers * slots
    )
    expected = [
        {
            "HOROVOD_HOSTNAME": s.hostname,
            "HOROVOD_RANK": str(s.rank),
            "HOROVOD_SIZE": str(s.size),
            "HOROVOD_LOCAL_RANK": str(s.local_rank),
            "HOROVOD_LOCAL_SIZE": str(s.local_size),
            "HOROVOD_CROSS_RANK": str(s.cross_rank),
            "HOROVOD_CROSS_SIZE": str(s.cross_size),
        }
        for s in plan
    ]
    ours = [
        rank_env(Plan("l", 1, 1.0, index, name, workers, slots), slot)
        for index, name in enumerate(names)
        for slot in range(slots)
    ]
    assert ours == expected


def test_parse_hostfile() -> None:
    text = "# plan\na.svc slots=2\n\nb.svc slots=2\nc.svc\n"
    assert parse_hostfile(text) == [("a.svc", 2), ("b.svc", 2), ("c.svc", 1)]
    with pytest.raises(ValueError, match="line 1"):
        parse_hostfile("a.svc slots=x\n")
    with pytest.raises(ValueError, match="no hosts"):
        parse_hostfile("# nothing\n")
