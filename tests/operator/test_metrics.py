"""The jobs-by-phase gauge: each job counted once, under its latest phase."""

from __future__ import annotations

import json
import re

from prometheus_client import CollectorRegistry, Gauge

from horovod_operator.metrics import PhaseTracker


def _values(registry: CollectorRegistry) -> dict[tuple[str, str], float]:
    return {
        (s.labels["namespace"], s.labels["phase"]): s.value
        for metric in registry.collect()
        for s in metric.samples
        if s.name == "jobs"
    }


def test_a_job_moves_between_phases_and_leaves_when_forgotten() -> None:
    registry = CollectorRegistry()
    tracker = PhaseTracker(Gauge("jobs", "test", ["namespace", "phase"], registry=registry))
    tracker.set(("a", "j1"), None)
    tracker.set(("a", "j2"), "Running")
    assert _values(registry) == {("a", "Pending"): 1, ("a", "Running"): 1}
    tracker.set(("a", "j1"), "Running")
    tracker.set(("a", "j1"), "Running")
    assert _values(registry) == {("a", "Pending"): 0, ("a", "Running"): 2}
    tracker.drop(("a", "j2"))
    tracker.drop(("a", "never-seen"))
    tracker.set(("b", "j1"), "Succeeded")
    assert _values(registry) == {
        ("a", "Pending"): 0,
        ("a", "Running"): 1,
        ("b", "Succeeded"): 1,
    }


def _registered() -> set[str]:
    from horovod_operator.metrics import REGISTRY

    names = set()
    for metric in REGISTRY.collect():
        suffix = "_total" if metric.type == "counter" else ""
        names.add(metric.name + suffix)
    return names


def test_every_metric_is_documented() -> None:
    from localcluster.paths import REPO

    documented = set(
        re.findall(r"`(horovod_operator_\w+)`", (REPO / "docs" / "metrics.md").read_text())
    )
    assert documented == _registered()


def test_the_dashboard_asks_only_for_metrics_that_exist() -> None:
    from localcluster.paths import REPO

    dashboard = json.loads(
        (REPO / "charts/horovod-operator/dashboards/horovod-operator.json").read_text()
    )
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    used = {
        re.sub(r"_(bucket|count|sum)$", "", name)
        for expr in exprs
        for name in re.findall(r"horovod_operator_\w+", expr)
    }
    assert used and used <= _registered(), used - _registered()
    # Every panel reads something the operator serves.
    assert len(exprs) >= len(dashboard["panels"])


def test_json_log_lines_name_their_job_as_fields() -> None:
    import logging

    import kopf
    from kopf._core.actions.loggers import make_formatter

    from horovod_operator import names

    record = logging.LogRecord(
        "horovod_operator.executor",
        logging.INFO,
        __file__,
        1,
        "job %s/%s: %s",
        ("ns", "j", "x"),
        None,
    )
    for key, value in names.log_fields("ns", "j").items():
        setattr(record, key, value)
    line = json.loads(make_formatter(log_format=kopf.LogFormat.JSON).format(record))
    assert line["message"] == "job ns/j: x"
    assert line["object"] == {
        "apiVersion": "horovod.ai/v1alpha1",
        "kind": "HorovodJob",
        "namespace": "ns",
        "name": "j",
    }


def test_the_loop_lag_says_what_the_longest_block_cost_and_times_collections() -> None:
    import asyncio
    import gc
    import time

    from horovod_operator import metrics

    async def block_then_stop() -> None:
        task = asyncio.create_task(metrics.measure_loop_lag(interval=0.01))
        await asyncio.sleep(0.05)
        began = time.process_time()
        while time.process_time() - began < 0.3:  # the loop's own work: CPU
            pass
        gc.collect()
        await asyncio.sleep(0.05)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    callbacks = list(gc.callbacks)
    asyncio.run(block_then_stop())
    assert metrics.LOOP_LAG_MAX._value.get() >= 0.25
    assert metrics.LOOP_LAG_MAX_CPU._value.get() >= 0.25  # the block was our own CPU
    assert metrics.GC_PAUSE_MAX._value.get() > 0
    assert gc.callbacks == callbacks  # the timer leaves with the measurement
