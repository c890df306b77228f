"""`kubectl apply` to Succeeded with real pods: where the time goes, ours and mpi-operator's.

The local end-to-end rung (localcluster.nodeagent: each pod a set of processes in
its own network namespace, real sshd, real Open MPI, real Horovod training) runs
the same program under both operators: a kubeflow/mpi-operator MPIJob in the
shape of its Horovod examples (tests/testdata/mpijob-horovod.yaml); for ours,
the same program as a HorovodJob of our own (our sshd wrapper, our launcher) and
that MPIJob converted by `hvjob convert` (the image's sshd, plain horovodrun).
A watch records when each state is first seen (this process's monotonic clock,
from just before the create), and
rank 0's first-step line is read, with its kubelet timestamp, from the launcher's
log once the job is done:

    created      every worker pod exists
    scheduled    every worker is bound to a node
    ready        every worker is Ready (its sshd is serving)
    launcher     the launcher's container runs
    first_step   rank 0 printed its HVJOB_RANK line (after hvd.init, before step 1)
    finished     the job is Succeeded

The steps between them are what a user waits for: the operator's reaction and the
scheduler's (to `scheduled`), container start and sshd (to `ready`), the launcher's
creation and start (to `launcher`), then mpirun's ssh fan-out, the interpreter
and framework imports and hvd.init (to `first_step`), then training. The import
share of that is measured apart (`import_seconds`). tests/e2e/test_realpods.py
runs it; `make bench-realpods` writes docs/benchmarks/realpods.json.
"""

from __future__ import annotations

import datetime
import re
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final

from localcluster.kube import Client

Obj = dict[str, Any]

MILESTONES: Final = ("created", "scheduled", "ready", "launcher", "first_step", "finished")
STEPS: Final = {
    "created": "apply -> every worker pod exists (operator)",
    "scheduled": "-> every worker bound (scheduler)",
    "ready": "-> every worker Ready (container start, sshd)",
    "launcher": "-> launcher container running (operator, Job controller, start)",
    "first_step": "-> rank 0's first step (ssh fan-out, imports, hvd.init)",
    "finished": "-> Succeeded (training, then the operator's status)",
}
_RANK0: Final = re.compile(r"HVJOB_RANK rank=0 ")
# How much of the launcher's log each run keeps (its timeline).
TIMELINE_LINES: Final = 12
TIMELINE_WIDTH: Final = 100
_STAMP: Final = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?)Z ")


def _ready(pod: Mapping[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or ()
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _running(pod: Mapping[str, Any]) -> bool:
    statuses = (pod.get("status") or {}).get("containerStatuses") or ()
    return any("running" in (s.get("state") or {}) or "terminated" in (s.get("state") or {})
               for s in statuses)  # fmt: skip


class PodClock:
    """When each pod of one job was first seen created, bound, Ready and running, and
    when the job was first seen finished (`finished_of`: its phase, or None)."""

    def __init__(self, name: str, finished_of: Callable[[Obj], str | None]) -> None:
        self.name = name
        self.finished_of = finished_of
        self.started = time.monotonic()
        self.pods: dict[str, dict[str, float]] = {}
        self.finished: tuple[str, float] | None = None
        self.cond = threading.Condition()

    def on_pod(self, event: Obj) -> None:
        now = time.monotonic() - self.started
        pod = event["object"]
        name = pod["metadata"]["name"]
        if event.get("type") == "DELETED" or not name.startswith(f"{self.name}-"):
            return
        seen = {
            "created": True,
            "scheduled": bool((pod.get("spec") or {}).get("nodeName")),
            "ready": _ready(pod),
            "running": _running(pod),
        }
        with self.cond:
            marks = self.pods.setdefault(name, {})
            for state, now_true in seen.items():
                if now_true:
                    marks.setdefault(state, now)
            self.cond.notify_all()

    def on_job(self, event: Obj) -> None:
        job = event["object"]
        if job["metadata"]["name"] != self.name or event.get("type") == "DELETED":
            return
        phase = self.finished_of(job)
        with self.cond:
            if phase and self.finished is None:
                self.finished = (phase, time.monotonic() - self.started)
                self.cond.notify_all()

    def wait_finished(self, timeout: float) -> str:
        with self.cond:
            if not self.cond.wait_for(lambda: self.finished is not None, timeout):
                raise TimeoutError(f"{self.name} did not finish in {timeout:.0f}s: {self.pods}")
            assert self.finished is not None
            return self.finished[0]

    def launcher_pod(self) -> str | None:
        with self.cond:
            return next((p for p in self.pods if p.startswith(f"{self.name}-launcher")), None)


def _stamp(line: str) -> float | None:
    m = _STAMP.match(line)
    if m is None:
        return None
    moment = datetime.datetime.fromisoformat(m.group(1)[:26]).replace(tzinfo=datetime.UTC)
    return moment.timestamp()


def first_step_stamp(log: str) -> float | None:
    """Unix time of rank 0's HVJOB_RANK line in a `timestamps=true` log, if there."""
    for line in log.splitlines():
        if _RANK0.search(line):
            return _stamp(line)
    return None


def log_timeline(log: str, since: float, lines: int = TIMELINE_LINES) -> list[list[Any]]:
    """The log's first `lines` lines up to rank 0's first step, each as [seconds after
    `since`, its text cut short]: where the launcher's time goes (its ssh set-up,
    mpirun's first words, each rank's start), from the kubelet's stamps."""
    out: list[list[Any]] = []
    for line in log.splitlines()[:lines]:
        at = _stamp(line)
        text = line.split(" ", 1)[1] if at is not None and " " in line else line
        out.append([None if at is None else round(at - since, 2), text[:TIMELINE_WIDTH]])
        if _RANK0.search(line):
            break
    return out


def milestones(
    pods: Mapping[str, Mapping[str, float]],
    name: str,
    workers: int,
    finished: float | None,
    first_step: float | None,
) -> dict[str, float | None]:
    """Seconds after apply of each milestone (None: not seen), from PodClock's marks;
    `first_step` already converted to seconds after apply."""

    def last(state: str) -> float | None:
        marks = [m.get(state) for p, m in pods.items() if p.startswith(f"{name}-worker-")]
        if len(marks) < workers or any(v is None for v in marks):
            return None
        return max(v for v in marks if v is not None)

    launcher = next((m for p, m in pods.items() if p.startswith(f"{name}-launcher")), {})
    return {
        "created": last("created"),
        "scheduled": last("scheduled"),
        "ready": last("ready"),
        "launcher": launcher.get("running"),
        "first_step": first_step,
        "finished": finished,
    }


def steps(marks: Mapping[str, float | None]) -> dict[str, float | None]:
    """Each milestone's time after the one before it (the first: after apply)."""
    out: dict[str, float | None] = {}
    before: float | None = 0.0
    for key in MILESTONES:
        at = marks.get(key)
        out[key] = None if at is None or before is None else round(at - before, 2)
        before = at
    return out


def run_one(
    client: Client,
    namespace: str,
    jobs_path: str,
    job: Obj,
    workers: int,
    finished_of: Callable[[Obj], str | None],
    launcher_log: Callable[[str], str],
    timeout: float = 600,
) -> dict[str, Any]:
    """Create `job` in `namespace` and time it to the end: its phase, the milestones
    (seconds after the create was sent) and the steps between them."""
    name = job["metadata"]["name"]
    clock = PodClock(name, finished_of)
    stop = threading.Event()
    client.watch_in_thread(f"/api/v1/namespaces/{namespace}/pods", clock.on_pod, stop)
    client.watch_in_thread(jobs_path, clock.on_job, stop)
    try:
        time.sleep(0.5)  # both watches listed: nothing of the job can be missed
        wall, clock.started = time.time(), time.monotonic()
        client.create(jobs_path, job)
        phase = clock.wait_finished(timeout)
        time.sleep(0.5)  # the last pod events of the end
    finally:
        stop.set()
    launcher = clock.launcher_pod()
    log = launcher_log(launcher) if launcher else ""
    stamp = first_step_stamp(log)
    finished = clock.finished[1] if clock.finished else None
    marks = milestones(
        clock.pods, name, workers, finished, None if stamp is None else round(stamp - wall, 2)
    )
    return {
        "phase": phase,
        "milestones": {k: None if v is None else round(v, 2) for k, v in marks.items()},
        "steps": steps(marks),
        "launcher_log": log_timeline(log, wall),
    }


def import_seconds(python: str, modules: Iterable[str], runs: int = 3) -> float:
    """The median wall time of a fresh interpreter importing `modules`: the part of
    "-> first step" every rank spends before Horovod starts, on either operator."""
    code = "; ".join(f"import {m}" for m in modules)
    times = []
    for _ in range(runs):
        started = time.monotonic()
        subprocess.run([python, "-c", code], check=True, capture_output=True, timeout=300)
        times.append(time.monotonic() - started)
    return round(sorted(times)[len(times) // 2], 2)


def summary(runs: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, dict[str, float | None]]:
    """Per operator, the median of each milestone and step over its runs."""
    out: dict[str, dict[str, float | None]] = {}
    for operator, results in runs.items():
        row: dict[str, float | None] = {}
        for part in ("milestones", "steps"):
            for key in MILESTONES:
                values = sorted(v for r in results if (v := r[part].get(key)) is not None)
                row[f"{part}.{key}"] = values[len(values) // 2] if values else None
        out[operator] = row
    return out


def table(runs: Mapping[str, Sequence[Mapping[str, Any]]], labels: Mapping[str, str]) -> str:
    """The medians as Markdown: one row per step, a column per operator, and each
    other operator's ratio to the last one (the peer)."""
    med = summary(runs)
    ops = list(runs)
    ours, peer = ops[:-1], ops[-1]
    ratio_heads = [f"{o}/{peer}" if len(ops) > 2 else "ours/theirs" for o in ours]
    head = "| step | " + " | ".join(f"{labels.get(o, o)} (n={len(runs[o])})" for o in ops)
    lines = [head + " | " + " | ".join(ratio_heads) + " |"]
    lines.append("|---|" + "---|" * (len(ops) + len(ours)))
    rows = [(STEPS[key], f"steps.{key}") for key in MILESTONES] + [
        (f"**apply -> {key.replace('_', ' ')}**", f"milestones.{key}")
        for key in ("first_step", "finished")
    ]
    for title, field in rows:
        cells = {o: med[o][field] for o in ops}
        row = [_seconds(cells[o]) for o in ops] + [_ratio(cells[o], cells[peer]) for o in ours]
        lines.append(f"| {title} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def _ratio(ours: float | None, theirs: float | None) -> str:
    return "-" if ours is None or not theirs else f"{ours / theirs:.2f}"
