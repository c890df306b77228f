"""Pure helpers: a pod object (a dict from the API server) in, plain data out.

Nothing here touches the network, namespaces or processes, so the rules that a
kubelet follows (env resolution, volume files and modes, pod phase, status
shape) are tested without root or a cluster.
"""

from __future__ import annotations

import base64
import datetime as dt
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

Obj = dict[str, Any]

CLUSTER_DOMAIN = "cluster.local"
# Every node's (and so every pod's host) address: where the API server finds the log endpoint.
NODE_IP = "127.0.0.1"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Containers run as root, with the host's root HOME, unless their securityContext
# says otherwise (run_as).
HOME = "/root"
# No images: the host's programs stand in for the image, whose user is root. A
# container that must not run as root (runAsNonRoot) and names no user runs as
# the worker image's user instead (Dockerfile.worker: USER 1000:1000), with the
# HOME a runtime gives a uid the image's passwd does not know.
IMAGE_NON_ROOT_USER = (1000, 1000)
NON_ROOT_HOME = "/"
# A Secret or ConfigMap file's mode when neither defaultMode nor the item's mode is set.
DEFAULT_FILE_MODE = 0o644

_VAR_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)|\$\$")


def now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---------------------------------------------------------------- env


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: known names are replaced, $$ escapes, unknown stay."""

    def sub(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env.get(name, match.group(0))

    return _VAR_REF.sub(sub, text)


_CPU_UNITS = {"m": 0.001}
_MEM_UNITS = {
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "k": 10**3,
    "K": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
}


def parse_quantity(value: str | int | float) -> float:
    """A resource quantity ("500m", "4Gi", "2") as a number of base units."""
    text = str(value).strip()
    for suffix, factor in {**_MEM_UNITS, **_CPU_UNITS}.items():
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * factor
    return float(text)


def resource_field_value(container: Obj, ref: Obj, node_allocatable: Mapping[str, str]) -> str:
    """resourceFieldRef like the kubelet: limits fall back to the node's allocatable.

    The value is divided by `divisor` (default 1) and rounded up, as the kubelet does.
    """
    resource = ref["resource"]
    kind, _, name = resource.partition(".")
    resources = container.get("resources") or {}
    raw = (resources.get(kind) or {}).get(name)
    if raw is None and kind == "requests":
        raw = (resources.get("limits") or {}).get(name)
    if raw is None:
        raw = node_allocatable.get(name, "0")
    divisor = parse_quantity(ref.get("divisor") or "1")
    value = parse_quantity(raw) / divisor
    whole = int(value)
    return str(whole if value == whole else whole + 1)


def field_value(pod: Obj, path: str, pod_ip: str, host_ip: str) -> str:
    """fieldRef: the fields the downward API supports."""
    meta, spec = pod["metadata"], pod["spec"]
    simple = {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", ""),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", ""),
        "status.podIP": pod_ip,
        "status.podIPs": pod_ip,
        "status.hostIP": host_ip,
        "status.hostIPs": host_ip,
    }
    if path in simple:
        return str(simple[path])
    match = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
    if match:
        return str((meta.get(match.group(1)) or {}).get(match.group(2), ""))
    if path in ("metadata.labels", "metadata.annotations"):
        items = meta.get(path.split(".")[1]) or {}
        return "\n".join(f'{k}="{v}"' for k, v in sorted(items.items()))
    raise ValueError(f"fieldRef {path!r} is not supported by the node agent")


# Reads a Secret ("secretRef") or ConfigMap ("configMapRef") by name: its data as text,
# None when it does not exist.
DataLookup = Callable[[str, str], dict[str, str] | None]


def container_env(
    pod: Obj,
    container: Obj,
    *,
    pod_ip: str,
    host_ip: str,
    node_allocatable: Mapping[str, str],
    lookup: DataLookup,
    base: Mapping[str, str],
) -> dict[str, str]:
    """The environment of one container: `base` (the image's), envFrom, then env in order."""
    env = dict(base)
    for source in container.get("envFrom") or []:
        prefix = source.get("prefix", "")
        for kind in ("configMapRef", "secretRef"):
            ref = source.get(kind)
            if ref:
                data = lookup(kind, ref["name"])
                if data is None and not ref.get("optional"):
                    raise ValueError(f"{kind} {ref['name']!r} not found")
                for key, value in (data or {}).items():
                    env[prefix + key] = value
    for var in container.get("env") or []:
        name = var["name"]
        if "value" in var or "valueFrom" not in var:
            env[name] = expand(var.get("value", ""), env)
            continue
        source = var["valueFrom"]
        if "fieldRef" in source:
            env[name] = field_value(pod, source["fieldRef"]["fieldPath"], pod_ip, host_ip)
        elif "resourceFieldRef" in source:
            ref = source["resourceFieldRef"]
            target = container
            if ref.get("containerName"):
                target = next(
                    c
                    for c in [
                        *pod["spec"]["containers"],
                        *(pod["spec"].get("initContainers") or []),
                    ]
                    if c["name"] == ref["containerName"]
                )
            env[name] = resource_field_value(target, ref, node_allocatable)
        else:
            for kind, ref_key in (
                ("secretKeyRef", "secretRef"),
                ("configMapKeyRef", "configMapRef"),
            ):
                ref = source.get(kind)
                if ref:
                    found = (lookup(ref_key, ref["name"]) or {}).get(ref["key"])
                    if found is None:
                        if not ref.get("optional"):
                            raise ValueError(f"{kind} {ref['name']}/{ref['key']} not found")
                    else:
                        env[name] = found
    return env


def command_line(container: Obj, env: Mapping[str, str]) -> list[str]:
    """command + args with $(VAR) expanded; an empty command is an error (no image entrypoint)."""
    argv = [expand(a, env) for a in (container.get("command") or [])]
    argv += [expand(a, env) for a in (container.get("args") or [])]
    if not argv:
        raise ValueError(
            f"container {container['name']!r} has no command: the node agent runs no images, "
            "so it cannot fall back to an image's entrypoint"
        )
    return argv


# ---------------------------------------------------------------- users


@dataclass(frozen=True)
class RunAs:
    """Who a container's process is, and what it may gain (podinit.py applies it)."""

    uid: int
    gid: int
    groups: tuple[int, ...]
    no_new_privs: bool  # allowPrivilegeEscalation: false
    drop_all_capabilities: bool  # capabilities.drop: [ALL] (the bounding set)


def run_as(pod: Obj, container: Obj) -> RunAs:
    """The container's user from its securityContext and the pod's (the container's
    wins), as the kubelet resolves it; ValueError where runAsNonRoot meets uid 0."""
    pod_context = pod["spec"].get("securityContext") or {}
    context = container.get("securityContext") or {}

    def pick(key: str) -> Any:
        return context.get(key, pod_context.get(key))

    uid, gid, non_root = pick("runAsUser"), pick("runAsGroup"), pick("runAsNonRoot")
    if uid is None:
        uid, image_gid = IMAGE_NON_ROOT_USER if non_root else (0, 0)
        gid = image_gid if gid is None else gid
    if non_root and uid == 0:
        raise ValueError(
            f"container {container['name']!r} has runAsNonRoot and would run as root (uid 0)"
        )
    groups = [int(g) for g in pod_context.get("supplementalGroups") or ()]
    if pod_context.get("fsGroup") is not None:
        groups.append(int(pod_context["fsGroup"]))
    drop = (context.get("capabilities") or {}).get("drop") or ()
    return RunAs(
        uid=int(uid),
        gid=int(gid or 0),
        groups=tuple(groups),
        no_new_privs=context.get("allowPrivilegeEscalation") is False,
        drop_all_capabilities="ALL" in drop,
    )


# ---------------------------------------------------------------- volumes


@dataclass(frozen=True)
class VolumeFile:
    """One file of a Secret/ConfigMap/downwardAPI volume, relative to the volume's root."""

    path: str
    content: bytes
    mode: int


def _item_files(data: Mapping[str, bytes], source: Obj, default_mode: int) -> list[VolumeFile]:
    items = source.get("items")
    if not items:
        return [VolumeFile(key, value, default_mode) for key, value in sorted(data.items())]
    files = []
    for item in items:
        if item["key"] not in data:
            if source.get("optional"):
                continue
            raise ValueError(f"key {item['key']!r} not found")
        files.append(VolumeFile(item["path"], data[item["key"]], item.get("mode", default_mode)))
    return files


def secret_data(secret: Obj) -> dict[str, bytes]:
    data = {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}
    data.update({k: v.encode() for k, v in (secret.get("stringData") or {}).items()})
    return data


def config_map_data(config_map: Obj) -> dict[str, bytes]:
    data = {k: v.encode() for k, v in (config_map.get("data") or {}).items()}
    data.update({k: base64.b64decode(v) for k, v in (config_map.get("binaryData") or {}).items()})
    return data


def secret_files(secret: Obj | None, source: Obj) -> list[VolumeFile]:
    """The files of a `secret` volume source (None when the Secret does not exist)."""
    if secret is None:
        if source.get("optional"):
            return []
        raise ValueError(f"secret {source.get('secretName')!r} not found")
    return _item_files(secret_data(secret), source, source.get("defaultMode", DEFAULT_FILE_MODE))


def config_map_files(config_map: Obj | None, source: Obj) -> list[VolumeFile]:
    if config_map is None:
        if source.get("optional"):
            return []
        raise ValueError(f"configmap {source.get('name')!r} not found")
    data = config_map_data(config_map)
    return _item_files(data, source, source.get("defaultMode", DEFAULT_FILE_MODE))


def downward_files(pod: Obj, source: Obj, pod_ip: str, host_ip: str) -> list[VolumeFile]:
    default_mode = source.get("defaultMode", DEFAULT_FILE_MODE)
    files = []
    for item in source.get("items") or []:
        if "fieldRef" in item:
            value = field_value(pod, item["fieldRef"]["fieldPath"], pod_ip, host_ip)
        else:
            container = next(
                c
                for c in pod["spec"]["containers"]
                if c["name"] == item["resourceFieldRef"].get("containerName")
            )
            value = resource_field_value(container, item["resourceFieldRef"], {})
        files.append(VolumeFile(item["path"], value.encode(), item.get("mode", default_mode)))
    return files


# ---------------------------------------------------------------- names


def pod_hostname(pod: Obj) -> str:
    """spec.hostname, else the pod name (truncated to a DNS label, as the kubelet does)."""
    return str(pod["spec"].get("hostname") or pod["metadata"]["name"])[:63].rstrip("-.")


def pod_fqdn(pod: Obj) -> str | None:
    """<hostname>.<subdomain>.<ns>.svc.cluster.local when the pod has a subdomain."""
    subdomain = pod["spec"].get("subdomain")
    if not subdomain:
        return None
    ns = pod["metadata"]["namespace"]
    return f"{pod_hostname(pod)}.{subdomain}.{ns}.svc.{CLUSTER_DOMAIN}"


def hosts_file(pod: Obj, pod_ip: str) -> str:
    """The pod's /etc/hosts, in the kubelet's format."""
    lines = [
        "# Kubernetes-managed hosts file (written by the local node agent).",
        "127.0.0.1\tlocalhost",
        "::1\tlocalhost ip6-localhost ip6-loopback",
    ]
    names = [pod_hostname(pod)]
    fqdn = pod_fqdn(pod)
    if fqdn:
        names.insert(0, fqdn)
    lines.append(f"{pod_ip}\t" + "\t".join(names))
    for alias in pod["spec"].get("hostAliases") or []:
        lines.append(f"{alias['ip']}\t" + "\t".join(alias.get("hostnames") or []))
    return "\n".join(lines) + "\n"


def resolv_conf(namespace: str, nameserver: str) -> str:
    """The pod's /etc/resolv.conf: the cluster DNS and the kubelet's search path."""
    search = f"{namespace}.svc.{CLUSTER_DOMAIN} svc.{CLUSTER_DOMAIN} {CLUSTER_DOMAIN}"
    return f"nameserver {nameserver}\nsearch {search}\noptions ndots:5\n"


# ---------------------------------------------------------------- status


@dataclass
class ContainerState:
    """What the agent knows about one container, turned into a containerStatus."""

    name: str
    image: str = ""
    state: str = "waiting"  # waiting | running | terminated
    reason: str = "ContainerCreating"
    message: str = ""
    exit_code: int | None = None
    started_at: str | None = None
    finished_at: str | None = None
    restart_count: int = 0
    ready: bool = False
    # False while a startupProbe has not yet succeeded (the kubelet's `started`).
    startup_done: bool = True
    container_id: str = ""
    last_terminated: Obj | None = None
    extra: Obj = field(default_factory=dict)

    def terminated(self) -> Obj:
        out: Obj = {
            "exitCode": self.exit_code if self.exit_code is not None else 0,
            "reason": self.reason,
            "startedAt": self.started_at,
            "finishedAt": self.finished_at,
            "containerID": self.container_id,
        }
        if self.message:
            out["message"] = self.message
        return out

    def to_status(self) -> Obj:
        if self.state == "running":
            state: Obj = {"running": {"startedAt": self.started_at}}
        elif self.state == "terminated":
            state = {"terminated": self.terminated()}
        else:
            state = {"waiting": {"reason": self.reason}}
            if self.message:
                state["waiting"]["message"] = self.message
        status: Obj = {
            "name": self.name,
            "image": self.image,
            "imageID": "",
            "state": state,
            "lastState": {"terminated": self.last_terminated} if self.last_terminated else {},
            "ready": self.ready,
            "restartCount": self.restart_count,
            "started": self.state == "running" and self.startup_done,
        }
        if self.container_id:
            status["containerID"] = self.container_id
        return status


# The kubelet keeps at most this much of a termination message, and of a log tail
# (FallbackToLogsOnError) at most 80 lines of it.
TERMINATION_MESSAGE_BYTES = 4096
FALLBACK_LOG_BYTES, FALLBACK_LOG_LINES = 2048, 80


def log_tail(log: bytes) -> str:
    """The end of a log as FallbackToLogsOnError keeps it: 80 lines, 2 KiB at most."""
    lines = log.splitlines(keepends=True)[-FALLBACK_LOG_LINES:]
    return b"".join(lines)[-FALLBACK_LOG_BYTES:].decode(errors="replace")


def exit_reason(code: int) -> str:
    return "Completed" if code == 0 else "Error"


def exit_code_of(returncode: int) -> int:
    """Popen's returncode (negative for a signal) as a container exit code (128 + signal)."""
    return 128 - returncode if returncode < 0 else returncode


def pod_phase(
    restart_policy: str, init_done: bool, init_failed: bool, containers: list[ContainerState]
) -> str:
    """The pod phase from its containers, by the kubelet's rules."""
    if init_failed and restart_policy == "Never":
        return "Failed"
    if not init_done:
        return "Pending"
    states = [c.state for c in containers]
    if any(s == "waiting" for s in states) and not any(c.started_at for c in containers):
        return "Pending"
    if all(s == "terminated" for s in states):
        if all(c.exit_code == 0 for c in containers):
            return "Succeeded"
        if restart_policy == "Never":
            return "Failed"
        return "Running"  # OnFailure / Always: the failed ones restart
    return "Running"


def condition(kind: str, ok: bool, reason: str | None = None, since: str | None = None) -> Obj:
    out: Obj = {"type": kind, "status": "True" if ok else "False", "lastProbeTime": None}
    out["lastTransitionTime"] = since or now()
    if reason and not ok:
        out["reason"] = reason
    return out
