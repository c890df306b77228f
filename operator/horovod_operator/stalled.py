"""Why a job does not progress: the problems that make it Stalled, and the startup timeout.

Pure: the observation and the status in, (reason, message) pairs out, most
important first: names held by other objects, the API server's refusals, then each
pod the scheduler or kubelet cannot start.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Final

from . import claims, names, podgroups
from .api import STARTING_PHASES, HorovodJob, HorovodJobStatus
from .children import (
    ONE_EACH,
    Children,
    Obj,
    attempt_of,
    controller_of,
    describe_owner,
    is_terminating,
    name_of,
)
from .conditions import (
    REASON_CHILD_CONFLICT,
    REASON_CREATE_FAILED,
    REASON_CREATE_FORBIDDEN,
    REASON_CREATE_THROTTLED,
    REASON_DISCOVERY_PENDING,
    REASON_GANG_UNAVAILABLE,
    REASON_OLD_CHILD,
    due_time,
)
from .plan import Observation
from .pod_state import pod_phase, pod_problem


def refused_phrase(kind: str, name: str) -> str:
    """How a Stalled message names a refused create (and how a later reconcile, with
    no refusal in memory, finds the object it was about)."""
    return f"the API server refused to create {kind} {name}"


_REFUSED: Final = re.compile(refused_phrase(r"(\S+)", r"([^\s:]+)"))


def refused_and_missing(message: str, status: HorovodJobStatus, children: Children) -> bool:
    """Whether an object a Stalled message names as refused is still missing."""
    return any(
        not _exists(kind, name, status, children) for kind, name in _REFUSED.findall(message)
    )


def _exists(kind: str, name: str, status: HorovodJobStatus, children: Children) -> bool:
    if kind == "Pod":
        return any(name_of(pod) == name for pod in children.all_pods())
    if kind == "Job":
        return children.launcher_job is not None
    if kind == "Workload":
        return children.workload is not None
    if kind == "PodGroup":
        # Not watched; it is created while a worker of the attempt is missing.
        replicas = status.workers.replicas if status.workers else 0
        return len(_current(children.workers, status)) >= replicas
    if kind in ONE_EACH:
        return children.one_of(kind) is not None
    return False


def undiscovered(job: HorovodJob, seen: Observation) -> list[tuple[str, str]]:
    """(feature key, what) of the cluster features this job needs whose discovery
    has not answered yet (discovery.py): nothing of the job is created meanwhile,
    so it neither runs outside its queue's quota nor starts without its gang."""
    policy = job.spec.scheduling.gang.policy
    needs = []
    if job.spec.scheduling.queue and policy != "Volcano" and seen.kueue_api is None:
        needs.append(("kueue", "Kueue's Workload API (kueue.x-k8s.io/v1beta2 workloads)"))
    if policy in ("Auto", "Native") and seen.gang_api is None:
        needs.append(("gang", "the native gang's PodGroup API (scheduling.k8s.io/v1beta1)"))
    if policy == "Volcano" and seen.volcano_api is None:
        needs.append(("volcano", "Volcano's PodGroup API (scheduling.volcano.sh/v1beta1)"))
    if policy == "Coscheduling" and seen.coscheduling_api is None:
        needs.append(("coscheduling", "coscheduling's PodGroup API (scheduling.x-k8s.io/v1alpha1)"))
    return needs


def claims_problem(job: HorovodJob, seen: Observation) -> tuple[str, str] | None:
    """Why the worker's DRA claims keep its pods from being created, if they do."""
    if seen.worker_claims is None:
        return None
    resources = job.spec.worker.resources
    plugin = resources.gpus() if resources else None
    return claims.blocking(job.spec.slots_per_worker, plugin, seen.worker_claims)


def problems(job: HorovodJob, status: HorovodJobStatus, seen: Observation) -> list[tuple[str, str]]:
    children = seen.children
    problems: list[tuple[str, str]] = []
    claim = claims_problem(job, seen)
    if claim is not None and len(children.workers) < job.spec.worker_count():
        problems.append(claim)
    for key, what in undiscovered(job, seen):
        error = seen.discovery_errors.get(key, "no answer yet")
        problems.append(
            (
                REASON_DISCOVERY_PENDING,
                f"the operator cannot tell yet whether the cluster serves {what}: {error}. "
                "Nothing of the job is created until the API server answers (asked again "
                "with backoff)",
            )
        )
    if job.spec.scheduling.gang.needs_native() and seen.gang_api is False:
        why = (
            "spec.scheduling.gang.policy is Native"
            if job.spec.scheduling.gang.policy == "Native"
            else "spec.scheduling.gang.resourceClaims are shared through the native gang"
        )
        problems.append(
            (
                REASON_GANG_UNAVAILABLE,
                f"{why}, but the cluster does not serve "
                "scheduling.k8s.io/v1beta1 PodGroup; no worker is created without its gang. "
                "Fix: enable the GenericWorkload feature gate on kube-apiserver (with "
                "--runtime-config=scheduling.k8s.io/v1beta1=true), kube-controller-manager "
                "and kube-scheduler, then restart the operator; or set the policy to Auto",
            )
        )
    gang = podgroups.of(job)
    served = {"Volcano": seen.volcano_api, "Coscheduling": seen.coscheduling_api}
    if gang is not None and served[gang.policy] is False:
        problems.append(
            (
                REASON_GANG_UNAVAILABLE,
                f"spec.scheduling.gang.policy is {gang.policy}, but the cluster does not "
                f"serve {gang.api_version} PodGroup (checked when the operator started); no "
                f"worker is created without its gang. Fix: {gang.install}; or set the policy "
                "to Auto",
            )
        )
    job_name = str(seen.body["metadata"]["name"])
    # A name another object holds is never created (plan_creates), so it blocks the job.
    needed = _needed_names(job_name, status, ssh=job.spec.launch_mode == "mpi")
    for name in sorted(needed):
        other = children.foreign.get(name)
        if other is not None:
            problems.append(_conflict(other, job_name))
    for refusal in seen.refusals:
        if refusal.code == 403:
            problems.append(
                (
                    REASON_CREATE_FORBIDDEN,
                    f"{refused_phrase(refusal.kind, refusal.name)}: "
                    f"{refusal.message}; retrying with backoff",
                )
            )
        elif refusal.code == 409:
            problems.append((REASON_CHILD_CONFLICT, refusal.message))
        elif refusal.code == 429 or refusal.code >= 500:
            reason = REASON_CREATE_THROTTLED if refusal.code == 429 else REASON_CREATE_FAILED
            problems.append(
                (
                    reason,
                    f"{refused_phrase(refusal.kind, refusal.name)} ({refusal.code}): "
                    f"{refusal.message}; retrying with backoff",
                )
            )
    # An elastic job's waiting workers are capacity it may get, not a stall, once
    # those it starts with run (decide.py puts them in the job's message).
    running = status.workers.running if status.workers else 0
    enough = job.spec.elastic is not None and (
        status.phase == "Running" or running >= job.spec.worker.replicas
    )
    workers = [] if enough else _current(children.workers, status)
    stuck = []
    topology = job.spec.scheduling.topology
    confined = topology.key if topology is not None and topology.mode == "Required" else None
    for i, pod in enumerate([*workers, *children.launcher_pods]):
        found = _pending_problem(pod, seen)
        if found is not None:
            why = found[1]
            if found[0] == "Unschedulable" and confined is not None and i < len(workers):
                # The scheduler speaks of the domain it tried, not of the constraint.
                why += (
                    f" [spec.scheduling.topology: every worker in one {confined} domain, "
                    "and none has room for all of them]"
                )
            stuck.append((found[0], f"pod {name_of(pod)}: {why}"))
    # In a gang, one pod says what is short ("Insufficient nvidia.com/gpu") and the
    # others only that the group is incomplete: name the shortage first.
    stuck.sort(key=lambda problem: _GANG_ONLY in problem[1])
    return [*problems, *stuck]


_POD_PROBLEM: Final = re.compile(r"^pod (\S+): (.*)$", re.S)
# Pods named in the Event of a cause (the status names none when several share it).
EVENT_PODS: Final = 3


def summarize(problems: list[tuple[str, str]]) -> tuple[str, str, str]:
    """(reason, message, detail) of Stalled: a message that stays the same while the
    same causes hold, and a detail for its Event (how many pods, a few names).

    Pods that wait for the same reason with the same words are one cause. The message
    names the pod only when it is alone with its cause, and never counts: a count or
    a name that moves as the scheduler walks a big job's pods made every pass a status
    write and a Warning Event (300 workers that do not fit: 35 Events in 40 s)."""
    causes: dict[tuple[str, str], list[str]] = {}
    for reason, text in problems:
        found = _POD_PROBLEM.match(text)
        pod, why = (found.group(1), found.group(2)) if found else ("", text)
        causes.setdefault((reason, why), []).append(pod)
    listed = {cause: index for index, cause in enumerate(causes)}

    # Problems that are not a pod's come first, as listed (the gang, conflicts,
    # refusals: problems() lists them in a fixed order); then the pods' causes by
    # reason and words, a gang's "group incomplete" last.
    def rank(item: tuple[tuple[str, str], list[str]]) -> tuple[bool, int, bool, str, str]:
        (reason, why), pods = item
        a_pods = any(pods)
        return (a_pods, 0 if a_pods else listed[(reason, why)], _GANG_ONLY in why, reason, why)

    ordered = sorted(causes.items(), key=rank)
    (reason, why), pods = ordered[0]
    named = [p for p in pods if p]
    if not named:
        message = why
    elif len(named) == 1:
        message = f"pod {named[0]}: {why}"
    else:
        message = f"worker pods wait: {why}"
    others = sorted({r for (r, _), _pods in ordered[1:]} - {reason})
    if len(ordered) > 1:
        message += f" (and more: {', '.join(others) or 'the same reason, other words'})"
    detail = ""
    if len(named) > 1:
        shown = ", ".join(sorted(named, key=_natural)[:EVENT_PODS])
        detail = f" ({len(named)} pods, e.g. {shown})"
    return reason, message, detail


def _natural(name: str) -> tuple[str, int]:
    """worker-2 before worker-10."""
    head, _, index = name.rpartition("-")
    return (head, int(index)) if index.isdigit() else (name, -1)


def waiting_workers(status: HorovodJobStatus, seen: Observation) -> list[str]:
    """What this attempt's Pending workers wait for, one "pod <name>: <why>" each."""
    waiting = []
    for pod in _current(seen.children.workers, status):
        found = _pending_problem(pod, seen)
        if found is not None:
            waiting.append(f"pod {name_of(pod)}: {found[1]}")
    return waiting


def _pending_problem(pod: Obj, seen: Observation) -> tuple[str, str] | None:
    if pod_phase(pod) != "Pending" or is_terminating(pod):
        return None
    return pod_problem(pod) or seen.pod_warnings.get(name_of(pod))


# How kube-scheduler words a gang member held back only because its group is incomplete.
_GANG_ONLY: Final = "cannot be satisfied:"


def _needed_names(job: str, status: HorovodJobStatus, ssh: bool) -> set[str]:
    replicas = status.workers.replicas if status.workers else 0
    return {
        *([names.secret_name(job)] if ssh else []),
        names.config_name(job),
        names.service_name(job),
        names.launcher_name(job),
        *(names.worker_name(job, i) for i in range(replicas)),
    }


def _conflict(other: Obj, job: str) -> tuple[str, str]:
    kind, name = other.get("kind", "object"), name_of(other)
    controller = controller_of(other)
    if controller is not None and controller.get("kind") == "HorovodJob":
        same_name = controller.get("name") == job
        if same_name or is_terminating(other):
            return (
                REASON_OLD_CHILD,
                f"{kind} {name} of a previous HorovodJob named {controller.get('name')} "
                f"(uid {controller.get('uid')}) is still being deleted; waiting for it to go",
            )
    return (
        REASON_CHILD_CONFLICT,
        f"{kind} {name} already exists and is not controlled by this job "
        f"({describe_owner(other)}); delete or rename it so the job can create its own",
    )


def _current(workers: list[Obj], status: HorovodJobStatus) -> list[Obj]:
    return [pod for pod in workers if attempt_of(pod) == status.restarts]


def startup_timeout(status: HorovodJobStatus, timeout: int | None, now: datetime) -> str | None:
    """The failure message when the attempt's start took too long, else None."""
    if status.phase not in STARTING_PHASES:
        return None
    due = due_time(status.attempt_start_time, timeout)
    if due is None or now < due:
        return None
    waited = status.message or "the workers"
    return f"the attempt did not start within startupTimeoutSeconds ({timeout}s): {waited}"
