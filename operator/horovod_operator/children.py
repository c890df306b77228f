"""Reading the children of a job: which objects are its own, its launcher's state
and the current attempt's pods (what a pod's status says: pod_state.py).

Labels select, ownership decides. The watches bring every object that carries
the operator's labels for a job name, including those of a deleted job of the
same name that garbage collection has not removed yet, and anything a user
labelled by hand. A child counts only when its controller ownerReference names
the job's UID; a launcher pod when its controller is the job's launcher Job.
Pure functions over plain dicts, no client.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from . import kinds, names
from .api import Failure, LauncherStatus
from .pod_state import exit_code, pod_failures, pod_phase

Obj = Mapping[str, Any]

# --- accessors ---------------------------------------------------------------------------


def metadata_of(obj: Obj) -> Mapping[str, Any]:
    meta: Mapping[str, Any] = obj.get("metadata") or {}
    return meta


def labels_of(obj: Obj) -> Mapping[str, str]:
    labels: Mapping[str, str] = metadata_of(obj).get("labels") or {}
    return labels


def name_of(obj: Obj) -> str:
    return str(metadata_of(obj).get("name", ""))


def uid_of(obj: Obj) -> str:
    return str(metadata_of(obj).get("uid", ""))


def attempt_of(obj: Obj) -> int | None:
    value = labels_of(obj).get(names.LABEL_ATTEMPT)
    return int(value) if value is not None and value.isdigit() else None


def role_of(obj: Obj) -> str | None:
    return labels_of(obj).get(names.LABEL_ROLE)


def is_terminating(obj: Obj) -> bool:
    return bool(metadata_of(obj).get("deletionTimestamp"))


def controller_of(obj: Obj) -> Mapping[str, Any] | None:
    """The ownerReference with controller: true, if any."""
    for reference in metadata_of(obj).get("ownerReferences") or ():
        if reference.get("controller"):
            found: Mapping[str, Any] = reference
            return found
    return None


def controlled_by(obj: Obj, uid: str) -> bool:
    controller = controller_of(obj)
    return bool(uid) and controller is not None and controller.get("uid") == uid


def describe_owner(obj: Obj) -> str:
    """Who controls `obj`, for a message."""
    controller = controller_of(obj)
    if controller is None:
        return "no controller"
    return f"{controller.get('kind')} {controller.get('name')} (uid {controller.get('uid')})"


def job_condition(batch_job: Obj | None, type_: str) -> bool:
    if batch_job is None:
        return False
    for condition in (batch_job.get("status") or {}).get("conditions") or []:
        if condition.get("type") == type_ and condition.get("status") == "True":
            return True
    return False


# --- sorting the observed objects --------------------------------------------------------


@dataclass
class Children:
    """What exists of one job: its own children, and objects in the way."""

    workers: list[Obj] = field(default_factory=list)
    launcher_job: Obj | None = None
    launcher_pods: list[Obj] = field(default_factory=list)
    # Launcher pods whose Job is gone (deleted, or orphaned with --cascade=orphan):
    # they carry the job's UID label and must go before another launcher starts.
    stray_launcher_pods: list[Obj] = field(default_factory=list)
    secret: Obj | None = None
    config_map: Obj | None = None
    service: Obj | None = None
    # The job's Kueue Workload (kueue.x-k8s.io/v1beta2), an unfinished one first.
    workload: Obj | None = None
    # Objects with the job's labels that it does not control, by name.
    foreign: dict[str, Obj] = field(default_factory=dict)
    # Launcher pods seen with a disruption (DisruptionTarget: an eviction, a drain,
    # preemption, node loss), by name -> reason, kept by the executor after they are
    # gone: the launcher Job (backoffLimit 0) says Failed once its pod is deleted,
    # and the pod that said why is gone by then.
    launcher_disruptions: dict[str, str] = field(default_factory=dict)

    def all_pods(self) -> list[Obj]:
        return [*self.workers, *self.launcher_pods, *self.stray_launcher_pods]

    def one_of(self, kind: str) -> Obj | None:
        """The job's own object of a kind it has one of (kinds.DELETED_WHEN_INVALID)."""
        attribute = ONE_EACH[kind]
        found: Obj | None = getattr(self, attribute)
        return found


# The kinds a job has one of, and the Children field that holds it.
ONE_EACH: Final = {
    kinds.SECRET.kind: "secret",
    kinds.CONFIG_MAP.kind: "config_map",
    kinds.SERVICE.kind: "service",
}


def sort_children(uid: str, objects: Mapping[str, Iterable[Obj]]) -> Children:
    """Split what the label-selected watches show (memory.Indexes.children, and the
    Secret read by name), by kind name (kinds.ApiKind.kind), into the job's own and
    the rest. A kind this does not know is a programming error, not a foreign object."""
    unknown = set(objects) - {
        kinds.LAUNCHER_JOB.kind,
        kinds.POD.kind,
        kinds.WORKLOAD.kind,
        *ONE_EACH,
    }
    if unknown:
        raise ValueError(f"sort_children: no rule for the kinds {sorted(unknown)}")
    children = Children()
    foreign = children.foreign
    # The launcher Job first: its pods are told apart by its UID.
    for batch_job in objects.get(kinds.LAUNCHER_JOB.kind, ()):
        if role_of(batch_job) != names.ROLE_LAUNCHER:
            continue
        if controlled_by(batch_job, uid):
            children.launcher_job = batch_job
        else:
            foreign[name_of(batch_job)] = batch_job
    launcher_uid = uid_of(children.launcher_job) if children.launcher_job else ""
    for pod in objects.get(kinds.POD.kind, ()):
        role = role_of(pod)
        if role == names.ROLE_WORKER and controlled_by(pod, uid):
            children.workers.append(pod)
        elif role == names.ROLE_LAUNCHER and launcher_uid and controlled_by(pod, launcher_uid):
            children.launcher_pods.append(pod)
        elif role == names.ROLE_LAUNCHER and labels_of(pod).get(names.LABEL_JOB_UID) == uid:
            children.stray_launcher_pods.append(pod)
        else:
            foreign[name_of(pod)] = pod
    for kind, attribute in ONE_EACH.items():
        for item in objects.get(kind, ()):
            if controlled_by(item, uid):
                setattr(children, attribute, item)
            else:
                foreign[name_of(item)] = item
    workloads = list(objects.get(kinds.WORKLOAD.kind, ()))
    own = [w for w in workloads if controlled_by(w, uid)]
    foreign.update({name_of(w): w for w in workloads if not controlled_by(w, uid)})
    if own:
        # A finished Workload is history; the unfinished one is the job's now.
        children.workload = min(own, key=lambda w: (workload_finished(w), name_of(w)))
    children.workers.sort(key=name_of)
    children.launcher_pods.sort(key=lambda p: metadata_of(p).get("creationTimestamp") or "")
    return children


def workload_condition(workload: Obj, type_: str) -> Mapping[str, Any] | None:
    """A condition of a Kueue Workload (metav1.Condition), if set."""
    for condition in (workload.get("status") or {}).get("conditions") or ():
        if condition.get("type") == type_:
            found: Mapping[str, Any] = condition
            return found
    return None


def workload_true(workload: Obj, type_: str) -> bool:
    condition = workload_condition(workload, type_)
    return condition is not None and condition.get("status") == "True"


def workload_finished(workload: Obj) -> bool:
    return workload_true(workload, "Finished")


# --- the current attempt -----------------------------------------------------------------


def deleted_workers(children: Children, attempt: int) -> list[Obj]:
    """Worker pods of this attempt that someone deleted (the operator deletes only
    pods of attempts it has left)."""
    return [pod for pod in children.workers if attempt_of(pod) == attempt and is_terminating(pod)]


def current_workers(children: Children, attempt: int) -> list[Obj]:
    """Worker pods of this attempt that are not on their way out, by name."""
    return [
        pod for pod in children.workers if attempt_of(pod) == attempt and not is_terminating(pod)
    ]


def stale_children(children: Children, attempt: int) -> list[str]:
    """Names of the pods and launcher Job that block the next attempt.

    Worker pods and the launcher Job have fixed names, and two launchers must
    never run at once, so a new attempt starts only once the old ones are gone.
    """
    blocking = [
        name_of(pod)
        for pod in children.workers
        if attempt_of(pod) != attempt or is_terminating(pod)
    ]
    launcher = children.launcher_job
    if launcher is not None and (attempt_of(launcher) != attempt or is_terminating(launcher)):
        blocking.append(name_of(launcher))
    blocking += [name_of(pod) for pod in children.stray_launcher_pods]
    if launcher is None:
        blocking += [name_of(pod) for pod in children.launcher_pods]
    return blocking


def launcher_state(children: Children, attempt: int) -> LauncherStatus | None:
    """The launcher of this attempt: its newest pod, completed by the Job's conditions."""
    launcher_job = children.launcher_job
    if launcher_job is None or attempt_of(launcher_job) != attempt:
        return None
    state = LauncherStatus(phase="Pending")
    if children.launcher_pods:
        newest = children.launcher_pods[-1]
        state = LauncherStatus(
            phase=pod_phase(newest), pod_name=name_of(newest), exit_code=exit_code(newest)
        )
    if job_condition(launcher_job, "Complete"):
        state.phase = "Succeeded"
    elif job_condition(launcher_job, "Failed") and state.phase != "Succeeded":
        state.phase = "Failed"
    return state


def launcher_failures(
    children: Children, launcher: LauncherStatus, pod_name: str | None = None
) -> list[Failure]:
    """The failures of the launcher's pod; `pod_name`: its name when it is gone."""
    for pod in children.launcher_pods:
        if name_of(pod) == launcher.pod_name and pod_phase(pod) == "Failed":
            return pod_failures(pod)
    name = launcher.pod_name or pod_name or "launcher"
    return [
        Failure(
            pod=name,
            container=names.LAUNCHER_CONTAINER,
            exit_code=launcher.exit_code,
            reason="Error",
        )
    ]
