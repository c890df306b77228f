"""Names and labels of the objects a HorovodJob owns: one-line helpers, one place."""

import hashlib
from typing import Final

from .api import API_VERSION, KIND

LABEL_JOB_NAME: Final = "horovod.ai/job-name"
# Kubernetes caps a label value (and a DNS label) at 63 characters.
LABEL_VALUE_MAX: Final = 63
LABEL_ROLE: Final = "horovod.ai/role"
LABEL_WORKER_INDEX: Final = "horovod.ai/worker-index"
# The restart attempt (status.restarts when created); pods of older attempts are
# only ever deleted, never counted, so a late event cannot fail a fresh attempt.
LABEL_ATTEMPT: Final = "horovod.ai/attempt"
# The UID of the HorovodJob: launcher pods carry it, so that a launcher pod whose
# Job is gone (deleted with --cascade=orphan) is still known as this job's.
LABEL_JOB_UID: Final = "horovod.ai/job-uid"
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
MANAGED_BY: Final = "horovod-operator"
LABEL_KUEUE_QUEUE: Final = "kueue.x-k8s.io/queue-name"

# The server-side selector of every pod and Job watch.
MANAGED_SELECTOR: Final = f"{LABEL_MANAGED_BY}={MANAGED_BY}"

WORKER_CONTAINER: Final = "worker"
LAUNCHER_CONTAINER: Final = "launcher"
SSH_VOLUME: Final = "horovod-ssh"
CONFIG_VOLUME: Final = "horovod-config"

# The per-job ConfigMap (<job>-config) is mounted here in the launcher.
CONFIG_MOUNT_PATH: Final = "/etc/horovod/config"
HOSTFILE: Final = "hostfile"
DISCOVER_HOSTS: Final = "discover_hosts.sh"
# An elastic job's launcher reads the workers' agents from here (<host>:<port> lines).
AGENTS: Final = "agents"

ROLE_LAUNCHER: Final = "launcher"
ROLE_WORKER: Final = "worker"

# Set on every container for the user's own code; the worker image reads none of them.
ENV_JOB_NAME: Final = "HVJOB_NAME"
ENV_JOB_NAMESPACE: Final = "HVJOB_NAMESPACE"
ENV_ROLE: Final = "HVJOB_ROLE"  # ROLE_LAUNCHER or ROLE_WORKER


def worker_name(job: str, index: int) -> str:
    return f"{job}-worker-{index}"


def service_name(job: str) -> str:
    return f"{job}-worker"


def secret_name(job: str) -> str:
    return f"{job}-ssh"


def config_name(job: str) -> str:
    return f"{job}-config"


def launcher_name(job: str) -> str:
    return f"{job}-launcher"


def pod_group_name(job: str, attempt: int, size: int) -> str:
    """The workers' gang of one attempt and size. A restart's pods form a new group,
    and so does a resume with another worker count (a PodGroup's spec cannot
    change, and the suspended attempt's group would wait for the old count).

    Coscheduling puts the name in a label of every pod (63 characters at most): a
    54-character job (the longest allowed) passed that at its tenth restart, and its
    pods were refused. Such a name is made to fit: the job's name cut short and a
    hash of the whole, so that it stays distinct and the same on every reconcile."""
    name = f"{job}-gang-{attempt}-{size}"
    if len(name) <= LABEL_VALUE_MAX:
        return name
    suffix = f"-{hashlib.sha256(name.encode()).hexdigest()[:8]}-gang-{attempt}-{size}"
    return f"{job[: LABEL_VALUE_MAX - len(suffix)].rstrip('-')}{suffix}"


def workload_name(job: str, attempt: int) -> str:
    """The job's Kueue Workload, named after the attempt that first needed it (it
    stays the job's Workload through evictions and restarts)."""
    return f"hvjob-{job}-{attempt}"


def worker_host(job: str, namespace: str, index: int) -> str:
    """The DNS name of a worker pod through the headless Service."""
    return f"{worker_name(job, index)}.{service_name(job)}.{namespace}.svc"


def launcher_host(job: str, namespace: str) -> str:
    """The DNS name of the launcher pod (launchMode: gloo, where the headless
    Service selects it too): where the workers find the rendezvous server."""
    return f"{launcher_name(job)}.{service_name(job)}.{namespace}.svc"


def base_labels(job: str) -> dict[str, str]:
    return {LABEL_JOB_NAME: job, LABEL_MANAGED_BY: MANAGED_BY}


def role_labels(job: str, role: str) -> dict[str, str]:
    return {**base_labels(job), LABEL_ROLE: role}


def log_fields(namespace: str, name: str) -> dict[str, dict[str, str]]:
    """`extra=` for a log line about one job: kopf's JSON log format writes it as the
    line's "object" field (apiVersion, kind, namespace, name), so log pipelines
    filter on the job instead of parsing the message."""
    return {
        "k8s_ref": {"apiVersion": API_VERSION, "kind": KIND, "namespace": namespace, "name": name}
    }
