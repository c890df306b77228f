"""Validation rules beside the models: CEL rules of the CRD, child names, pod templates.

Pure and dependent on nothing but the standard library, so that both the models
(api.py) and the CRD generator (crd.py) read the same rules.
"""

from __future__ import annotations

import re
from typing import Any, Final

GPU_RESOURCE: Final = "nvidia.com/gpu"
DNS_LABEL_MAX: Final = 63
# A DNS-1035 label: the Service `<job>-worker` must start with a letter.
_DNS_1035_LABEL: Final = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


# --- CEL rules of the CRD ----------------------------------------------------------------

_GPU: Final = f"'{GPU_RESOURCE}'"
# On spec: checked on every create and update.
# As batch/v1 Job's, the controller that runs a job never changes under it: set or
# unset (here) and its value (MANAGED_BY_RULES, on the field: a string compared
# there is costed by its maxLength).
_MANAGED_BY_FIXED: Final = (
    "spec.managedBy cannot change; recreate the job to give it to another controller"
)
MANAGED_BY_RULES: Final[list[Any]] = [{"rule": "self == oldSelf", "message": _MANAGED_BY_FIXED}]
SPEC_RULES: Final[list[Any]] = [
    {
        "rule": "has(self.managedBy) == has(oldSelf.managedBy)",
        "message": _MANAGED_BY_FIXED,
        "fieldPath": ".managedBy",
        "reason": "FieldValueInvalid",
    },
    {
        "rule": (
            "!has(self.worker) || !has(self.worker.resources) || "
            "!has(self.worker.resources.limits) || "
            f"!({_GPU} in self.worker.resources.limits) || "
            f"self.slotsPerWorker <= int(self.worker.resources.limits[{_GPU}])"
        ),
        "message": "slotsPerWorker is more than the GPUs requested per worker in "
        "worker.resources.limits; each rank needs its own GPU",
        "fieldPath": ".slotsPerWorker",
        "reason": "FieldValueInvalid",
    },
    {
        "rule": "self.?scheduling.?gang.?minAvailable.orValue(1) <= "
        "(has(self.elastic) ? self.elastic.maxReplicas : self.?worker.?replicas.orValue(1))",
        "message": "scheduling.gang.minAvailable is more than worker.replicas (an elastic "
        "job's elastic.maxReplicas); at most every worker can be placed",
        "fieldPath": ".scheduling.gang.minAvailable",
        "reason": "FieldValueInvalid",
    },
    {
        "rule": "!has(self.elastic) || self.launchMode == 'gloo'",
        "message": "elastic needs launchMode gloo: Horovod's elastic training runs on Gloo, "
        "and the workers' agents start the ranks instead of ssh",
        "fieldPath": ".elastic",
        "reason": "FieldValueInvalid",
    },
    {
        "rule": "!has(self.elastic) || "
        "(self.elastic.minReplicas <= self.?worker.?replicas.orValue(1) && "
        "self.?worker.?replicas.orValue(1) <= self.elastic.maxReplicas)",
        "message": "worker.replicas (the count an elastic job starts with) must be between "
        "elastic.minReplicas and elastic.maxReplicas",
        "fieldPath": ".worker.replicas",
        "reason": "FieldValueInvalid",
    },
    {
        "rule": "self.launchMode != 'gloo' || "
        "(self.?launcher.?horovodrunArgs.orValue([]).size() == 0 && "
        "!self.?ssh.?authMountPath.hasValue())",
        "message": "launcher.horovodrunArgs and ssh.authMountPath need launchMode mpi: "
        "launchMode gloo runs no horovodrun and no ssh",
        "fieldPath": ".launchMode",
        "reason": "FieldValueInvalid",
    },
    {
        "rule": "!self.?ssh.?port.hasValue() || self.?ssh.?authMountPath.hasValue()",
        "message": "ssh.port is the port of an image's own sshd and needs ssh.authMountPath; "
        "the operator's worker sshd listens on 2222",
        "fieldPath": ".ssh.port",
        "reason": "FieldValueInvalid",
    },
]
# On the whole object: an update cannot change the shape of a started job. The
# status seen here is the stored one (updates of the main resource cannot
# change it), so "started" is what the operator last wrote.
_NOT_STARTED: Final = (
    "!has(oldSelf.status) || !has(oldSelf.status.phase) || "
    "!(oldSelf.status.phase in ['Pending', 'Starting', 'Running', 'Restarting'])"
)
ROOT_RULES: Final[list[Any]] = [
    {
        "rule": f"{_NOT_STARTED} || "
        "(self.spec.?worker.?replicas.orValue(1) == oldSelf.spec.?worker.?replicas.orValue(1) && "
        "self.spec.slotsPerWorker == oldSelf.spec.slotsPerWorker && "
        "self.spec.launchMode == oldSelf.spec.launchMode && "
        # Field by field: the estimated cost of comparing whole objects is over budget.
        "self.spec.?elastic.?minReplicas == oldSelf.spec.?elastic.?minReplicas && "
        "self.spec.?elastic.?maxReplicas == oldSelf.spec.?elastic.?maxReplicas && "
        "self.spec.?elastic.?timeoutSeconds == oldSelf.spec.?elastic.?timeoutSeconds && "
        "self.spec.?elastic.?resetLimit == oldSelf.spec.?elastic.?resetLimit)",
        "message": "spec.worker.replicas, spec.slotsPerWorker, spec.launchMode and "
        "spec.elastic cannot change while the job is started (Pending, Starting, Running, "
        "Restarting); suspend it (spec.runPolicy.suspend: true) or recreate it to change them",
        "fieldPath": ".spec",
        "reason": "FieldValueForbidden",
    },
]


def check_job_name(name: str, replicas: int) -> None:
    """Raise ValueError unless every child name is a valid DNS label.

    The longest names are the last worker's pod (and hostname) `<name>-worker-<n>`
    and the launcher Job `<name>-launcher`, whose name also becomes a label value.
    """
    longest = max(f"{name}-worker-{replicas - 1}", f"{name}-launcher", key=len)
    if len(longest) > DNS_LABEL_MAX:
        room = DNS_LABEL_MAX - (len(longest) - len(name))
        raise ValueError(
            f"metadata.name: {name!r} is too long: child name {longest!r} has "
            f"{len(longest)} characters, more than the {DNS_LABEL_MAX} of a DNS label; "
            f"use at most {room} characters"
        )
    if not _DNS_1035_LABEL.match(name):
        raise ValueError(
            f"metadata.name: {name!r} must be a DNS-1035 label (lowercase letters, digits "
            f"and '-', starting with a letter), since the worker Service is named after it"
        )


# --- pod templates -----------------------------------------------------------------------

# Fields of a PodTemplateSpec the builders read or merge into, with the shape
# each must have. The API server checks the rest when the pod is created.
_LIST_OF_OBJECTS: Final = ("containers", "initContainers", "volumes", "tolerations")
_CONTAINER_LISTS: Final = ("env", "envFrom", "volumeMounts", "ports")
# The key by which the builders merge their entries into a list of the template's
# (ours replace the user's that share it): a string wherever it is given.
_MERGE_KEYS: Final = {"volumes": "name", "env": "name", "volumeMounts": "mountPath"}


def check_template_shape(template: Any) -> None:
    """Raise ValueError when a pod template cannot be a core/v1 PodTemplateSpec in
    the places the builders touch (for example env written as a map)."""
    if template is None:
        return
    if not isinstance(template, dict):
        raise ValueError("must be a PodTemplateSpec object with metadata and spec")
    for key in ("metadata", "spec"):
        if template.get(key) is not None and not isinstance(template[key], dict):
            raise ValueError(f"{key} must be an object")
    metadata = template.get("metadata") or {}
    for key in ("labels", "annotations"):
        value = metadata.get(key)
        if value is not None and not (
            isinstance(value, dict) and all(isinstance(v, str) for v in value.values())
        ):
            raise ValueError(f"metadata.{key} must be a map of strings")
    spec = template.get("spec") or {}
    for key in _LIST_OF_OBJECTS:
        _check_list_of_objects(spec.get(key), f"spec.{key}")
    _check_merge_keys(spec.get("volumes"), "volumes", "spec.volumes")
    for index, container in enumerate(spec.get("containers") or []):
        where = f"spec.containers[{index}]"
        for key in _CONTAINER_LISTS:
            _check_list_of_objects(container.get(key), f"{where}.{key}")
            _check_merge_keys(container.get(key), key, f"{where}.{key}")
        for key in ("command", "args"):
            value = container.get(key)
            if value is not None and not (
                isinstance(value, list) and all(isinstance(v, str) for v in value)
            ):
                raise ValueError(f"{where}.{key} must be a list of strings")
        if container.get("resources") is not None and not isinstance(container["resources"], dict):
            raise ValueError(f"{where}.resources must be an object")


def _check_list_of_objects(value: Any, where: str) -> None:
    if value is None:
        return
    if not isinstance(value, list):
        raise ValueError(f"{where} must be a list of objects, got {type(value).__name__}")
    for index, item in enumerate(value):
        if not isinstance(item, dict):
            raise ValueError(f"{where}[{index}] must be an object, got {_json_type(item)}")


def _check_merge_keys(value: Any, list_name: str, where: str) -> None:
    key = _MERGE_KEYS.get(list_name)
    if key is None:
        return
    for index, item in enumerate(value or []):
        if item.get(key) is not None and not isinstance(item[key], str):
            raise ValueError(
                f"{where}[{index}].{key} must be a string, got {_json_type(item[key])}"
            )


def _json_type(value: Any) -> str:
    return "null" if value is None else type(value).__name__


# --- the operator's template policy (opt-in) ---------------------------------------------

# A job author must not gain through the operator what they could not do by
# creating pods themselves. Each rule has a name the refusal quotes.
_HOST_NAMESPACES: Final = ("hostNetwork", "hostPID", "hostIPC")
# The volume types a template may use: those PodSecurity `restricted` allows, less
# inline `csi` (a driver's own rules, not the namespace's, decide what it mounts).
# An allow-list, so that a type added to Kubernetes later is refused until checked:
# hostPath, nfs, iscsi, csi and the other in-tree sources reach storage the job's
# author could not claim through a PersistentVolumeClaim of their namespace.
ALLOWED_VOLUMES: Final = (
    "configMap",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
)


def template_policy_violations(job_name: str, where: str, template: Any) -> list[str]:
    """What the opt-in policy (--restrict-templates) refuses in one pod template
    (already checked by check_template_shape)."""
    if not isinstance(template, dict):
        return []
    spec = template.get("spec") or {}
    found = []
    account = spec.get("serviceAccountName") or spec.get("serviceAccount")
    if account and account != "default":
        found.append(
            f"rule ServiceAccount: {where}.spec.serviceAccountName names ServiceAccount "
            f"{account!r}; jobs run as the namespace's default ServiceAccount"
        )
    for key in _HOST_NAMESPACES:
        if spec.get(key):
            found.append(f"rule HostNamespaces: {where}.spec.{key} is true")
    if spec.get("nodeName"):
        found.append(
            f"rule NodeName: {where}.spec.nodeName binds the pod to a node past the "
            "scheduler (and its quota, gang and queue); use nodeSelector or affinity"
        )
    for volume in spec.get("volumes") or ():
        if isinstance(volume, dict):
            found.extend(_volume_violations(job_name, where, volume))
    for container in [*(spec.get("containers") or ()), *(spec.get("initContainers") or ())]:
        context = container.get("securityContext") or {}
        name = container.get("name")
        for port in container.get("ports") or ():
            if isinstance(port, dict) and port.get("hostPort"):
                found.append(
                    f"rule HostPort: {where} container {name!r} asks for hostPort "
                    f"{port['hostPort']} (a port of the node itself)"
                )
        if context.get("privileged"):
            found.append(f"rule Privileged: {where} container {name!r} is privileged")
        if (context.get("capabilities") or {}).get("add"):
            found.append(f"rule Privileged: {where} container {name!r} adds capabilities")
        for source in container.get("envFrom") or ():
            secret = (
                (source.get("secretRef") or {}).get("name") if isinstance(source, dict) else None
            )
            if _other_jobs_secret(job_name, secret):
                found.append(f"rule OtherJobSecret: {where} reads Secret {secret!r} of another job")
        for env in container.get("env") or ():
            ref = (
                ((env.get("valueFrom") or {}).get("secretKeyRef") or {})
                if isinstance(env, dict)
                else {}
            )
            if _other_jobs_secret(job_name, ref.get("name")):
                found.append(
                    f"rule OtherJobSecret: {where} reads Secret {ref.get('name')!r} of another job"
                )
    return found


def _volume_violations(job_name: str, where: str, volume: dict[str, Any]) -> list[str]:
    name = volume.get("name")
    kinds = [key for key in volume if key != "name"]
    found = []
    if "hostPath" in kinds:
        found.append(f"rule HostPath: {where}.spec.volumes {name!r} is a hostPath")
    other = [key for key in kinds if key not in ALLOWED_VOLUMES and key != "hostPath"]
    if other:
        found.append(
            f"rule VolumeType: {where}.spec.volumes {name!r} is a {other[0]} volume; "
            f"allowed: {', '.join(ALLOWED_VOLUMES)}"
        )
    secrets = [(volume.get("secret") or {}).get("secretName")]
    for source in (volume.get("projected") or {}).get("sources") or ():
        if isinstance(source, dict):
            secrets.append((source.get("secret") or {}).get("name"))
    for secret in secrets:
        if _other_jobs_secret(job_name, secret):
            found.append(f"rule OtherJobSecret: {where} mounts Secret {secret!r} of another job")
    return found


def _other_jobs_secret(job_name: str, secret: Any) -> bool:
    """A HorovodJob's SSH Secret is `<job>-ssh`; only its own job may use it."""
    return isinstance(secret, str) and secret.endswith("-ssh") and secret != f"{job_name}-ssh"
