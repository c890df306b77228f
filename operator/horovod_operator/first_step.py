"""Time to the first training step: where rank 0's output lands, and its start line.

Rank 0 prints `HVJOB_RANK rank=0 ...` (horovod_contract.RANK_PREFIX) once Horovod is
initialised and the initial state is broadcast, right before its first step: the
built-in trainers do, and a user's script can print the same line. It lands in
the launcher's log (horovodrun collects every rank's output, mpi) or worker 0's
(gloo: rank 0 runs there); an elastic job's rank 0 runs on one of its workers.
progress.py reads that log and, once the line is there, writes
status.firstStepTime (the line's kubelet timestamp, else when it was read), posts
a TrainingStarted Event and observes horovod_operator_job_time_to_first_step_seconds
from the job's creation: what a user waits for after `kubectl apply`.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any, Final

from . import names

REASON_TRAINING_STARTED: Final = "TrainingStarted"


# An elastic job's rank 0 is on the first worker its launcher found Ready, which
# is not always worker 0: at most this many workers' logs are read per look.
ELASTIC_CANDIDATES: Final = 4


def rank0_sources(
    body: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]
) -> list[tuple[str, str | None]]:
    """The (pod, container) logs that may hold rank 0's output, in the order to read
    them: the launcher's (mpi), worker 0's (gloo: rank 0 runs there), or for an
    elastic job the workers of the attempt that ran (Running, or ended) by index
    (rank 0 starts on the lowest-index worker Horovod's driver found Ready,
    elastic_launcher.py; only that one prints rank 0's line)."""
    status = body.get("status") or {}
    spec = body.get("spec") or {}
    attempt = str(status.get("restarts") or 0)

    def labels(pod: Mapping[str, Any]) -> Mapping[str, str]:
        return pod["metadata"].get("labels") or {}

    if spec.get("elastic"):
        workers = sorted(
            (
                p
                for p in pods
                if labels(p).get(names.LABEL_ATTEMPT) == attempt
                and labels(p).get(names.LABEL_ROLE) == names.ROLE_WORKER
                # Any that ran: the end's last look comes after the clean-up policy
                # stopped the workers, whose agents then end Failed (SIGTERM); their
                # logs still hold rank 0's line (the kind rung of 2026-12-06 missed it).
                and (p.get("status") or {}).get("phase") in ("Running", "Succeeded", "Failed")
            ),
            key=lambda p: (_index(labels(p).get(names.LABEL_WORKER_INDEX)), p["metadata"]["name"]),
        )
        chosen = workers[:ELASTIC_CANDIDATES]
        role = names.ROLE_WORKER
    elif spec.get("launchMode") == "gloo":
        wanted, role = names.worker_name(body["metadata"]["name"], 0), names.ROLE_WORKER
        chosen = [
            p
            for p in pods
            if p["metadata"]["name"] == wanted and labels(p).get(names.LABEL_ATTEMPT) == attempt
        ][:1]
    else:
        wanted = str((status.get("launcher") or {}).get("podName") or "")
        role = names.ROLE_LAUNCHER
        chosen = [p for p in pods if p["metadata"]["name"] == wanted][:1]
    sources = []
    for pod in chosen:
        containers = [c.get("name") for c in (pod.get("spec") or {}).get("containers") or ()]
        container = role if role in containers else (containers[0] if containers else None)
        sources.append((str(pod["metadata"]["name"]), container))
    return sources


def _index(label: str | None) -> int:
    """A worker's index label as a number; one that is not (a pod labelled by hand)
    sorts last instead of stopping the scan of every job."""
    try:
        return int(label or "")
    except ValueError:
        return sys.maxsize
