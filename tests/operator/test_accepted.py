"""The accepted spec kept in the job's ConfigMap (accepted.py), and how decide and the
executor use it: a rejected edit after a restart still runs on the spec it accepted."""

from __future__ import annotations

import json
from typing import Any

from horovod_operator import accepted
from horovod_operator.decide import decide
from horovod_operator.memory import JobMemory
from horovod_operator.observing import last_run
from horovod_operator.views import slim_config_map
from tests.operator.test_decide import (
    ALL_UP,
    BAD_TEMPLATE,
    RUNNING,
    body,
    cond,
    infra,
    launcher_job,
    observe,
    stored,
)


def config_map_recording(generation: int, spec: dict[str, Any]) -> dict[str, Any]:
    objects = infra()
    cm = objects["ConfigMap"][0]
    cm["metadata"]["annotations"] = accepted.record(generation, spec)
    return objects


def test_record_and_read_back() -> None:
    spec = {"image": "img", "worker": {"replicas": 2}}
    cm = {"metadata": {"annotations": accepted.record(3, spec)}}
    assert accepted.generation(cm) == 3
    assert accepted.recorded(cm) == (3, spec)
    # What the watch keeps of a ConfigMap keeps the record, and nothing else added.
    slim = slim_config_map({**cm, "metadata": {**cm["metadata"], "name": "j-config"}})
    assert slim["metadata"]["annotations"] == cm["metadata"]["annotations"]


def test_a_spec_too_big_for_annotations_keeps_only_its_generation() -> None:
    spec = {"command": ["x" * (accepted.MAX_SPEC_BYTES + 1)]}
    record = accepted.record(1, spec)
    assert record == {accepted.GENERATION: "1"}
    assert accepted.recorded({"metadata": {"annotations": record}}) is None


def test_an_unreadable_record_is_none() -> None:
    for record in (
        {accepted.GENERATION: "x", accepted.SPEC: "{}"},
        {accepted.GENERATION: "2", accepted.SPEC: "{not json"},
        {accepted.GENERATION: "2", accepted.SPEC: "[1]"},
        {},
    ):
        assert accepted.recorded({"metadata": {"annotations": record}}) is None
    assert accepted.recorded(None) is None


def test_a_new_jobs_config_map_records_its_spec() -> None:
    job = body()
    plan = decide(observe(job, with_infra=False))
    (cm,) = [c for c in plan.creates if c["kind"] == "ConfigMap"]
    assert accepted.recorded(cm) == (1, job["spec"])


def test_an_accepted_edit_is_recorded_once() -> None:
    edited = body(RUNNING, generation=2, image="img:2")
    objects = config_map_recording(1, body()["spec"])
    plan = decide(observe(edited, ALL_UP, launcher_job(), objects=objects))
    assert plan.config_annotations is not None
    assert accepted.recorded({"metadata": {"annotations": plan.config_annotations}}) == (
        2,
        edited["spec"],
    )
    # Recorded: the next reconcile writes nothing.
    objects = config_map_recording(2, edited["spec"])
    again = decide(observe(edited, ALL_UP, launcher_job(), objects=objects))
    assert again.config_annotations is None


def test_a_rejected_edit_keeps_the_record_and_a_lost_config_map_gets_it_back() -> None:
    first = body()
    edited = body(RUNNING, generation=2, worker=BAD_TEMPLATE)
    raw = (1, first["spec"])
    objects = config_map_recording(*raw)
    plan = decide(
        observe(edited, ALL_UP, launcher_job(), objects=objects, accepted_raw=raw,
                accepted_spec=accepted.parsed(raw[1], "img"))
    )  # fmt: skip
    assert cond(plan, "SpecRejected")[0] == "True"
    assert plan.config_annotations is None
    # The ConfigMap deleted by hand comes back with the spec the job runs on.
    objects = infra()
    objects["ConfigMap"] = []
    plan = decide(
        observe(edited, ALL_UP, launcher_job(), objects=objects, accepted_raw=raw,
                accepted_spec=accepted.parsed(raw[1], "img"))
    )  # fmt: skip
    (cm,) = [c for c in plan.creates if c["kind"] == "ConfigMap"]
    assert accepted.recorded(cm) == raw


def test_after_a_restart_the_record_is_read_and_the_job_finishes_on_it() -> None:
    first = body()
    edited = body(RUNNING, generation=2, worker=BAD_TEMPLATE)
    cm = config_map_recording(1, first["spec"])["ConfigMap"][0]
    memory = JobMemory()  # a new process: nothing remembered
    ran_on = last_run(memory, cm, 2)
    assert ran_on == (1, first["spec"]) and memory.accepted == ran_on
    # The launcher succeeded: the job ends Succeeded on the accepted spec.
    plan = decide(
        observe(edited, ALL_UP, launcher_job("Complete"), accepted_raw=ran_on,
                accepted_spec=accepted.parsed(ran_on[1], "img"))
    )  # fmt: skip
    assert stored(plan)["phase"] == "Succeeded"
    # No edit since the record: nothing is parsed, the body's own spec is used.
    memory = JobMemory()
    assert last_run(memory, cm, 1) is None


def test_the_record_is_compact_json() -> None:
    text = accepted.record(1, {"b": 1, "a": [1, 2]})[accepted.SPEC]
    assert text == '{"a":[1,2],"b":1}' and json.loads(text) == {"a": [1, 2], "b": 1}


# --- the accepted spec lost: a stand-in drives the job to its end -------------------------


def test_a_lost_spec_still_runs_to_its_end_on_its_pods() -> None:
    edited = body(RUNNING, generation=2, worker=BAD_TEMPLATE)
    objects = infra()
    objects["ConfigMap"] = []  # deleted while the operator was down
    running = decide(observe(edited, ALL_UP, launcher_job(), objects=objects))
    assert stored(running)["phase"] == "Running"
    rejected = cond(running, "SpecRejected")
    assert rejected[0] == "True" and "The spec it last accepted is lost" in rejected[2]
    # Nothing is built from a stand-in: not even the ConfigMap it lost.
    assert running.creates == [] and running.deletes == []
    # The launcher completed: Succeeded, and the running workers are cleaned up
    # (cleanPodPolicy Running, the default).
    done = decide(observe(edited, ALL_UP, launcher_job("Complete"), objects=objects))
    assert stored(done)["phase"] == "Succeeded"
    assert done.creates == []
    assert {d.name for d in done.deletes} | {n for s in done.sweeps for n in s.names} >= {
        "j-worker-0",
        "j-worker-1",
    }


def test_a_lost_spec_ends_a_failed_attempt_without_a_restart() -> None:
    edited = body(RUNNING, generation=2, worker=BAD_TEMPLATE)
    objects = infra()
    objects["ConfigMap"] = []
    failed = decide(observe(edited, ALL_UP, launcher_job("Failed"), objects=objects))
    status = stored(failed)
    assert status["phase"] == "Failed", status
    assert failed.creates == []


def test_a_lost_spec_uses_the_edits_valid_run_policy() -> None:
    # The template is broken, the runPolicy fine: its deadline applies.
    edited = body(
        {**RUNNING, "startTime": "2000-01-01T00:00:00Z"},
        generation=2,
        worker=BAD_TEMPLATE,
        runPolicy={"activeDeadlineSeconds": 60},
    )
    objects = infra()
    objects["ConfigMap"] = []
    plan = decide(observe(edited, ALL_UP, launcher_job(), objects=objects))
    status = stored(plan)
    assert (status["phase"], status["reason"]) == ("Failed", "DeadlineExceeded")
