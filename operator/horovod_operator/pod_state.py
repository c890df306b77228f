"""What a pod's status says: its phase, readiness, exit code, why it failed, whether
the cluster disrupted it, and why it cannot start. Pure functions over plain dicts
(what the watches keep, views.slim_pod), no client."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from .api import Failure

Obj = Mapping[str, Any]

MESSAGE_LIMIT: Final = 2048
# Waiting reasons of a container that mean it will not start by itself.
STUCK_WAITING_REASONS: Final = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "ErrImageNeverPull",
        "CreateContainerConfigError",
        "CreateContainerError",
        "CrashLoopBackOff",
        "RunContainerError",
        "PreStartHookError",
        "PostStartHookError",
    }
)


def pod_phase(pod: Obj) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")


def pod_ready(pod: Obj) -> bool:
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return bool(condition.get("status") == "True")
    return False


def exit_code(pod: Obj) -> int | None:
    for container in (pod.get("status") or {}).get("containerStatuses") or []:
        terminated = (container.get("state") or {}).get("terminated")
        if terminated is not None:
            code = terminated.get("exitCode")
            return int(code) if code is not None else None
    return None


def tail(message: str | None) -> str | None:
    """The end of a termination message (the kubelet already caps it; the API may not)."""
    if not message:
        return None
    return message[-MESSAGE_LIMIT:]


def pod_failures(pod: Obj) -> list[Failure]:
    """Why a failed pod failed: each container that exited non-zero, or the pod reason."""
    status = pod.get("status") or {}
    pod_reason = status.get("reason")
    failures = []
    for container in status.get("containerStatuses") or []:
        terminated = (container.get("state") or {}).get("terminated")
        if terminated and terminated.get("exitCode", 0) != 0:
            failures.append(
                Failure(
                    pod=_name(pod),
                    container=container.get("name"),
                    exit_code=terminated.get("exitCode"),
                    reason=pod_reason or terminated.get("reason") or "Error",
                    message=tail(terminated.get("message")),
                )
            )
    if not failures:
        containers = (pod.get("spec") or {}).get("containers") or [{}]
        failures.append(
            Failure(
                pod=_name(pod),
                container=containers[0].get("name"),
                exit_code=None,
                reason=pod_reason or "Error",
            )
        )
    return failures


def finished_at(pod: Mapping[str, Any]) -> tuple[str, str]:
    """When the pod's first container ended (RFC 3339 sorts as text), then its name;
    a pod with no such time sorts after those with one."""
    times = [
        str(terminated["finishedAt"])
        for container in (pod.get("status") or {}).get("containerStatuses") or ()
        if (terminated := (container.get("state") or {}).get("terminated"))
        and terminated.get("finishedAt")
    ]
    return (min(times) if times else "~", _name(pod))


# Pod reasons a kubelet or a node shutdown writes on a pod it stopped for its own reasons.
DISRUPTION_POD_REASONS: Final = frozenset({"Evicted", "Preempting", "Shutdown", "Terminated"})
DISRUPTION_TARGET: Final = "DisruptionTarget"


def has_condition(pod: Obj, type_: str, status: str = "True") -> bool:
    return any(
        c.get("type") == type_ and c.get("status") == status
        for c in (pod.get("status") or {}).get("conditions") or ()
    )


def disruption_of(pod: Obj) -> str | None:
    """Why the cluster, not the job, stopped this pod (None if it did not).

    DisruptionTarget is set by preemption, the Eviction API (drains), the taint
    manager and the kubelet; older kubelets only set the pod reason Evicted.
    """
    for condition in (pod.get("status") or {}).get("conditions") or ():
        if condition.get("type") == DISRUPTION_TARGET and condition.get("status") == "True":
            return str(condition.get("reason") or DISRUPTION_TARGET)
    reason = (pod.get("status") or {}).get("reason")
    return str(reason) if reason in DISRUPTION_POD_REASONS else None


def pod_problem(pod: Obj) -> tuple[str, str] | None:
    """Why a pod that should start cannot: (reason, message), or None.

    Reads what the scheduler (PodScheduled=False, Unschedulable) and the kubelet
    (a container waiting for a reason that will not clear by itself) wrote.
    """
    status = pod.get("status") or {}
    for condition in status.get("conditions") or ():
        if (
            condition.get("type") == "PodScheduled"
            and condition.get("status") == "False"
            and condition.get("reason") == "Unschedulable"
        ):
            return "Unschedulable", str(condition.get("message") or "no node fits the pod")
    for key in ("initContainerStatuses", "containerStatuses"):
        for container in status.get(key) or ():
            waiting = (container.get("state") or {}).get("waiting") or {}
            reason = waiting.get("reason")
            if reason in STUCK_WAITING_REASONS:
                detail = waiting.get("message") or reason
                return str(reason), f"container {container.get('name')}: {detail}"
    return None


def waiting_to_start(pod: Obj) -> bool:
    """Scheduled, not running yet, and no reason in its status: the kubelet may
    be mounting volumes (FailedMount only shows in the pod's Events)."""
    if pod_phase(pod) != "Pending" or pod_problem(pod) is not None:
        return False
    spec = pod.get("spec") or {}
    return bool(spec.get("nodeName"))


def _name(pod: Obj) -> str:
    return str((pod.get("metadata") or {}).get("name", ""))
