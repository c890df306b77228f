"""Pure builders: a validated HorovodJob in, one child object (a plain dict) out.

No kopf and no client imports here: every function is deterministic given its
arguments (the SSH key pair is passed in), so tests compare whole objects.
"""

from __future__ import annotations

import base64
import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import horovod_contract as contract

from . import names, podgroups
from .api import API_VERSION, KIND, MAX_SECONDS, HorovodJob, HorovodJobSpec
from .plan import Priority
from .sshkeys import KeyPair

Obj = dict[str, Any]

# How often kubelet probes an image's own sshd (spec.ssh.image, or a template's
# own command): a TCP connect. The first, at the container's start, finds sshd
# not yet listening, so Ready comes one period later: the least Kubernetes allows.
SSHD_READINESS_PERIOD_SECONDS = 1
# Our sshd's workers get an exec readiness probe instead: `horovod_worker.sshd
# --wait-listening` returns as soon as sshd sends its banner (waiting up to
# SSHD_WAIT_SECONDS), so the pod is Ready when sshd is. A readiness probe, not a
# startup probe: the kubelet runs a readiness probe at once when it sees the
# container running (prober_manager.UpdatePodStatus triggers it), while a startup
# probe waits for its worker's next tick, up to a period later (a second on kind's
# kubelet, docs/benchmarks "Real pods"). A run that fails leaves the pod not Ready,
# never kills it: an sshd that never answers fails the attempt by
# runPolicy.startupTimeoutSeconds, which names what it waited for.
SSHD_WAIT_SECONDS = 10
# After the start it only confirms sshd still answers (sshd is the container's
# process: if it goes, the container does): an interpreter every half minute.
SSHD_RECHECK_SECONDS = 30
# The elastic agent's /ready is asked less often: with failureThreshold 3, a
# period of 2 s lets a busy agent miss 6 s before its host leaves the job.
ELASTIC_READINESS_PERIOD_SECONDS = 2


def owner_reference(job: HorovodJob) -> Obj:
    """Makes the job the controlling owner: deleting it garbage-collects the child."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": job.metadata.name,
        "uid": job.metadata.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


POD_GROUP_API_VERSION: Final = "scheduling.k8s.io/v1beta1"
WORKLOAD_API_VERSION: Final = "kueue.x-k8s.io/v1beta2"


@dataclass(frozen=True)
class Admission:
    """Where Kueue admitted a pod set: its flavors' node labels and tolerations, and
    what its admission checks asked of the pods (podSetUpdates: labels, annotations,
    node selector, tolerations; a ProvisioningRequest's nodes, say).

    A pod of a job that Kueue admits carries no queue label (the Workload is the
    job's one claim on quota; with Kueue's pod integration a labelled pod would be
    a second), and carries spec.scheduling.priorityClassName only when it names a
    PriorityClass (a WorkloadPriorityClass alone is no pod priority)."""

    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: Sequence[Obj] = ()
    pod_priority_class: bool = True
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    # Kueue's Topology Aware Scheduling: the node labels of each pod's domain, by worker
    # index (the launcher: the first), from the pod set's topologyAssignment.
    domains: Sequence[Mapping[str, str]] = ()
    # The pods Kueue admitted of the pod set (fewer than asked under partial admission).
    count: int | None = None


def _metadata(job: HorovodJob, name: str, labels: dict[str, str]) -> Obj:
    return {
        "name": name,
        "namespace": job.metadata.namespace,
        "labels": labels,
        "ownerReferences": [owner_reference(job)],
    }


def new_ssh_secret(job: HorovodJob, keys: KeyPair, host_key: KeyPair) -> Obj:
    """Secret `<job>-ssh`: the client key pair and authorized_keys, and the job's host
    key with a known_hosts line for it, so that the launcher's ssh verifies that it
    reaches the job's own workers (no StrictHostKeyChecking=no)."""
    name = job.metadata.name
    data = {
        contract.SSH_PRIVATE_KEY: keys.private_openssh,
        contract.SSH_PUBLIC_KEY: keys.public_openssh,
        contract.SSH_AUTHORIZED_KEYS: keys.public_openssh,
        contract.SSH_HOST_KEY: host_key.private_openssh,
        # Any name: the workers are reached by several (pod FQDN, [host]:port), and
        # only holders of this Secret can present the key.
        contract.SSH_KNOWN_HOSTS: f"* {host_key.public_openssh}",
    }
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _metadata(job, names.secret_name(name), names.base_labels(name)),
        "type": "Opaque",
        "data": {key: base64.b64encode(value.encode()).decode() for key, value in data.items()},
    }


def hostfile(job: HorovodJob) -> str:
    """One `<host> slots=<n>` line per worker, the format horovodrun --hostfile reads."""
    spec, meta = job.spec, job.metadata
    return "".join(
        f"{names.worker_host(meta.name, meta.namespace, i)} slots={spec.slots_per_worker}\n"
        for i in range(spec.worker_count())
    )


def discover_hosts_script(job: HorovodJob) -> str:
    """A script printing `host:slots` lines, the format of horovodrun --host-discovery-script."""
    spec, meta = job.spec, job.metadata
    lines = [
        f"echo {names.worker_host(meta.name, meta.namespace, i)}:{spec.slots_per_worker}"
        for i in range(spec.worker_count())
    ]
    return "#!/bin/sh\n" + "\n".join(lines) + "\n"


def elastic_agents(job: HorovodJob) -> str:
    """Every worker an elastic job may have, as its launcher asks them: one
    `<host>:<agent port>` per line, up to maxReplicas. Written once: which of them
    can take ranks, the launcher asks them directly (elastic_launcher.py)."""
    meta = job.metadata
    return "".join(
        f"{names.worker_host(meta.name, meta.namespace, i)}:{contract.ELASTIC_AGENT_PORT}\n"
        for i in range(job.spec.worker_count())
    )


def new_config_map(job: HorovodJob) -> Obj:
    """ConfigMap `<job>-config`: the hostfile and discover_hosts.sh; an elastic
    job's agents instead."""
    name = job.metadata.name
    data = (
        {names.AGENTS: elastic_agents(job)}
        if job.spec.elastic
        else {
            names.HOSTFILE: hostfile(job),
            names.DISCOVER_HOSTS: discover_hosts_script(job),
        }
    )
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(job, names.config_name(name), names.base_labels(name)),
        "data": data,
    }


def new_worker_service(job: HorovodJob) -> Obj:
    """Headless Service `<job>-worker`: gives each worker pod a stable DNS name.

    publishNotReadyAddresses makes the names resolve before sshd is Ready, so
    nothing waits on DNS propagation after readiness. In gloo mode it selects
    the launcher pod too, whose name the workers need: its rendezvous server.
    """
    name = job.metadata.name
    selector = {names.LABEL_JOB_NAME: name, names.LABEL_ROLE: names.ROLE_WORKER}
    port = {"name": "ssh", "port": job.spec.ssh_port(), "targetPort": job.spec.ssh_port()}
    ports = [port]
    if job.spec.launch_mode == "gloo":
        selector = {names.LABEL_JOB_NAME: name}
        ports = [
            {
                "name": "rendezvous",
                "port": contract.GLOO_RENDEZVOUS_PORT,
                "targetPort": contract.GLOO_RENDEZVOUS_PORT,
            }
        ]
        if job.spec.elastic:
            ports.append(
                {
                    "name": "agent",
                    "port": contract.ELASTIC_AGENT_PORT,
                    "targetPort": contract.ELASTIC_AGENT_PORT,
                }
            )
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(job, names.service_name(name), names.base_labels(name)),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": selector,
            "ports": [{**p, "protocol": "TCP"} for p in ports],
        },
    }


# The interface CRI runtimes give a pod on the cluster network: kubelet asks the
# CNI plugins for eth0 (containerd and CRI-O alike). Multus adds others beside it
# (net1, ...), and a hostNetwork pod has the node's.
POD_INTERFACE: Final = "eth0"
MULTUS_NETWORKS_ANNOTATION: Final = "k8s.v1.cni.cncf.io/networks"
# horovodrun's option, also spelt --network-interfaces (argparse takes prefixes too).
NIC_OPTION: Final = "--network-interface"


def network_interface_args(spec: HorovodJobSpec) -> list[str]:
    """`--network-interfaces eth0` when the pods can have no other interface.

    Told none, horovodrun finds the interfaces every host shares before it
    starts mpirun: its driver here and a task service on every worker over ssh,
    each a Python start with Horovod's imports. That was most of the launcher's
    lead over mpirun on real pods (docs/benchmarks, "Real pods"). A pod with
    only the cluster network has one answer, so the operator gives it. Pods that
    may have more (hostNetwork, a Multus network annotation) keep horovodrun's
    discovery, and a user's own --network-interfaces always wins.
    """
    if any(arg.startswith(NIC_OPTION) for arg in spec.launcher.horovodrun_args):
        return []
    for template in (spec.worker.template, spec.launcher.template):
        template = template or {}
        if (template.get("spec") or {}).get("hostNetwork"):
            return []
        if MULTUS_NETWORKS_ANNOTATION in (
            (template.get("metadata") or {}).get("annotations") or {}
        ):
            return []
    return [f"{NIC_OPTION}s", POD_INTERFACE]


def launcher_command(spec: HorovodJobSpec) -> list[str]:
    """The launcher's horovodrun line; nobody counts ranks by hand.

    horovod_worker.sshd --client-only first copies the keys out of the Secret
    (modes ssh accepts, as any uid) and puts an ssh first on PATH that verifies
    the workers' host key, which horovodrun's own `-o StrictHostKeyChecking=no`
    cannot override (ssh keeps the first value it is given). Then our images'
    horovodrun (contract.HOROVODRUN_COMMAND) runs; an image of mpi-operator's
    kind has its own plain one.
    """
    options = [
        "-np",
        str(spec.total_slots()),
        "--hostfile",
        f"{names.CONFIG_MOUNT_PATH}/{names.HOSTFILE}",
        "-p",
        str(spec.ssh_port()),
        *network_interface_args(spec),
        *spec.launcher.horovodrun_args,
        *spec.command,
    ]
    if spec.ssh.image_managed():
        # An mpi-operator image: its ssh finds the keys in ~/.ssh and its
        # ssh_config decides about host keys, as under mpi-operator.
        return ["horovodrun", *options]
    return [*contract.LAUNCHER_SSH_CLIENT_COMMAND, *contract.HOROVODRUN_COMMAND, *options]


def gloo_launcher_command() -> list[str]:
    """The gloo launcher: Horovod's rendezvous server for the hostfile's plan."""
    return [
        *contract.GLOO_LAUNCHER_COMMAND,
        "--hostfile",
        f"{names.CONFIG_MOUNT_PATH}/{names.HOSTFILE}",
        "--port",
        str(contract.GLOO_RENDEZVOUS_PORT),
    ]


def gloo_worker_command(spec: HorovodJobSpec) -> list[str]:
    """A gloo worker: starts slotsPerWorker ranks of the user's command itself; an
    elastic one, those the launcher's driver asks for."""
    if spec.elastic:
        return [*contract.ELASTIC_AGENT_COMMAND, *spec.command]
    return [*contract.GLOO_WORKER_COMMAND, *spec.command]


def elastic_launcher_command(spec: HorovodJobSpec) -> list[str]:
    """An elastic job's launcher: Horovod's elastic driver over the workers' agents."""
    assert spec.elastic is not None
    slots = spec.slots_per_worker
    command = [
        *contract.ELASTIC_LAUNCHER_COMMAND,
        "--agents",
        f"{names.CONFIG_MOUNT_PATH}/{names.AGENTS}",
        "--np",
        str(spec.total_slots()),
        "--min-np",
        str(spec.elastic.min_replicas * slots),
        "--max-np",
        str(spec.elastic.max_replicas * slots),
        "--timeout",
        str(spec.elastic.timeout_seconds),
        "--port",
        str(contract.GLOO_RENDEZVOUS_PORT),
    ]
    if spec.elastic.reset_limit is not None:
        command += ["--reset-limit", str(spec.elastic.reset_limit)]
    return command


def _env(job: HorovodJob, role: str, index: int | None = None) -> list[Obj]:
    env = [
        {"name": names.ENV_JOB_NAME, "value": job.metadata.name},
        {"name": names.ENV_JOB_NAMESPACE, "value": job.metadata.namespace},
        {"name": names.ENV_ROLE, "value": role},
    ]
    if not job.spec.elastic:  # an elastic job's size changes
        env.append({"name": contract.ENV_EXPECTED_SIZE, "value": str(job.spec.total_slots())})
    gpus = job.spec.worker.gpus()
    if gpus:
        # On the launcher too: horovodrun exports its environment to every rank.
        env.append({"name": contract.ENV_GPUS_PER_WORKER, "value": str(gpus)})
    if job.spec.launch_mode == "gloo":
        if index is not None:
            env += _gloo_worker_env(job, index)
    elif role == names.ROLE_LAUNCHER:
        # Open MPI shortens hostfile names to their first label, and
        # `<job>-worker-<i>` alone does not resolve: pods' DNS search path covers
        # `<ns>.svc`, not the job's `<subdomain>.<ns>.svc`. Keep the full names.
        env.append({"name": "OMPI_MCA_orte_keep_fqdn_hostnames", "value": "true"})
    return env


def _gloo_worker_env(job: HorovodJob, index: int) -> list[Obj]:
    """A gloo worker's place in the job. Its host name is the one the launcher's
    plan (the hostfile) gives it; it waits for the rendezvous as long as an
    attempt may take to start."""
    meta, spec = job.metadata, job.spec
    rendezvous = f"{names.launcher_host(meta.name, meta.namespace)}:{contract.GLOO_RENDEZVOUS_PORT}"
    timeout = spec.run_policy.startup_timeout_seconds or MAX_SECONDS
    return [
        {"name": contract.ENV_GLOO_RENDEZVOUS, "value": rendezvous},
        {"name": contract.ENV_GLOO_RENDEZVOUS_TIMEOUT, "value": str(timeout)},
        {"name": contract.ENV_WORKER_INDEX, "value": str(index)},
        {
            "name": contract.ENV_WORKER_HOST,
            "value": names.worker_host(meta.name, meta.namespace, index),
        },
        {"name": contract.ENV_WORKER_COUNT, "value": str(spec.worker_count())},
        {"name": contract.ENV_SLOTS_PER_WORKER, "value": str(spec.slots_per_worker)},
    ]


def _volumes(job: HorovodJob, role: str) -> list[Obj]:
    name = job.metadata.name
    items: list[Obj] = [
        {"key": names.HOSTFILE, "path": names.HOSTFILE},
        {"key": names.DISCOVER_HOSTS, "path": names.DISCOVER_HOSTS, "mode": 0o755},
    ]
    if job.spec.elastic:
        items = [{"key": names.AGENTS, "path": names.AGENTS}]
    config: Obj = {
        "name": names.CONFIG_VOLUME,
        "configMap": {"name": names.config_name(name), "items": items},
    }
    if job.spec.launch_mode == "gloo":
        # No ssh at all; only the launcher reads the hostfile (its rendezvous plan).
        return [config] if role == names.ROLE_LAUNCHER else []
    if job.spec.ssh.image_managed():
        return [{"name": names.SSH_VOLUME, "secret": _mpi_operator_ssh_secret(name)}, config]
    return [
        {
            "name": names.SSH_VOLUME,
            # Readable by the pod's user whatever its uid (no fsGroup needed);
            # horovod_worker.sshd copies the keys into a private 0700 directory
            # with the modes ssh and sshd demand, and nothing reads them here.
            "secret": {"secretName": names.secret_name(name), "defaultMode": 0o444},
        },
        config,
    ]


def _mpi_operator_ssh_secret(name: str) -> Obj:
    """The job's Secret as kubeflow/mpi-operator mounts its own at sshAuthMountPath,
    file names and mode included, so that images written for it find what they
    expect (their ssh reads ~/.ssh/id_rsa; their sshd, authorized_keys)."""
    return {
        "secretName": names.secret_name(name),
        "defaultMode": 0o600,
        "items": [
            {"key": contract.SSH_PRIVATE_KEY, "path": "id_rsa"},
            {"key": contract.SSH_PUBLIC_KEY, "path": "id_rsa.pub"},
            {"key": contract.SSH_AUTHORIZED_KEYS, "path": "authorized_keys"},
        ],
    }


def _volume_mounts(job: HorovodJob, role: str) -> list[Obj]:
    config = {"name": names.CONFIG_VOLUME, "mountPath": names.CONFIG_MOUNT_PATH, "readOnly": True}
    if job.spec.launch_mode == "gloo":
        return [config] if role == names.ROLE_LAUNCHER else []
    ssh_path = job.spec.ssh.auth_mount_path or contract.SSH_MOUNT_PATH
    return [{"name": names.SSH_VOLUME, "mountPath": ssh_path, "readOnly": True}, config]


# What PodSecurity `restricted` demands of every container; gloo pods get it
# (unless their template says otherwise), since they need no root, no ssh and no
# capabilities. The user is the image's own (runAsNonRoot: the kubelet refuses
# an image whose user is root, or not numeric).
RESTRICTED_POD_SECURITY: Final[Obj] = {
    "runAsNonRoot": True,
    "seccompProfile": {"type": "RuntimeDefault"},
}
RESTRICTED_CONTAINER_SECURITY: Final[Obj] = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
}


def _restrict(pod_spec: Obj) -> None:
    """Add the restricted settings the template does not set itself."""
    context: Obj = pod_spec.setdefault("securityContext", {})
    for key, value in RESTRICTED_POD_SECURITY.items():
        context.setdefault(key, copy.deepcopy(value))
    containers = [*(pod_spec.get("initContainers") or []), *(pod_spec.get("containers") or [])]
    for container in containers:
        context = container.setdefault("securityContext", {})
        for key, value in RESTRICTED_CONTAINER_SECURITY.items():
            context.setdefault(key, copy.deepcopy(value))


STALL_CHECK_ENV: Final = "HOROVOD_STALL_CHECK_TIME_SECONDS"


def stall_check_seconds(deadline: int) -> int:
    """The stall inspector's time for a progress deadline: it warns after a quarter
    of it and checks as often, so its report is in the log well before the deadline."""
    return max(5, deadline // 4)


def _merge_named(existing: list[Obj], ours: list[Obj], key: str = "name") -> list[Obj]:
    """The user's entries, with ours replacing any that share their key."""
    taken = {item[key] for item in ours}
    return [item for item in existing if item.get(key) not in taken] + ours


def _main_container(pod_spec: Obj, name: str) -> Obj:
    """The container the operator configures: the one called `name`, else the first."""
    # null is absent to the API server, and so here.
    containers: list[Obj] = pod_spec.get("containers") or []
    pod_spec["containers"] = containers
    for container in containers:
        if container.get("name") == name:
            return container
    if not containers:
        containers.append({"name": name})
    return containers[0]


def _pod_template(
    job: HorovodJob,
    user_template: Obj | None,
    role: str,
    labels: dict[str, str],
    index: int | None = None,
    admission: Admission | None = None,
) -> tuple[Obj, Obj, Obj]:
    """Merge the user's PodTemplateSpec with what every pod of the job needs.

    The user's template is the base; the operator's labels, env, volumes and
    mounts are added (replacing same-named entries), since the launcher and
    workers cannot talk without them. Returns (metadata, pod spec, container).
    """
    template = copy.deepcopy(user_template or {})
    user_meta: Obj = template.get("metadata") or {}
    pod_spec: Obj = template.get("spec") or {}

    # An admission check's labels join the user's; the operator's own always win
    # (the job's pods are found by them).
    checked = admission.labels if admission is not None else {}
    all_labels = {**(user_meta.get("labels") or {}), **checked, **labels}
    # With Volcano the queue is Volcano's (its PodGroup's spec.queue), not Kueue's.
    if (
        job.spec.scheduling.queue
        and admission is None
        and podgroups.of(job) is not podgroups.VOLCANO
    ):
        all_labels[names.LABEL_KUEUE_QUEUE] = job.spec.scheduling.queue
    metadata: Obj = {"labels": all_labels}
    annotations = {
        **(user_meta.get("annotations") or {}),
        **(admission.annotations if admission is not None else {}),
    }
    if annotations:
        metadata["annotations"] = annotations

    # The operator restarts the whole job; kubelet restarting a rank in place
    # would leave horovodrun with a dead peer.
    pod_spec["restartPolicy"] = "Never"
    if job.spec.scheduling.scheduler_name:
        pod_spec["schedulerName"] = job.spec.scheduling.scheduler_name
    if job.spec.scheduling.priority_class_name and (
        admission is None or admission.pod_priority_class
    ):
        pod_spec["priorityClassName"] = job.spec.scheduling.priority_class_name
    if admission is not None and admission.node_selector:
        pod_spec["nodeSelector"] = {
            **(pod_spec.get("nodeSelector") or {}),
            **admission.node_selector,
        }
    slot = index or 0
    if admission is not None and slot < len(admission.domains):
        # Worker i on the i-th slot of Kueue's assignment: neighbouring ranks share a
        # domain (the assignment lists the domains sorted, each as often as its pods).
        pod_spec["nodeSelector"] = {
            **(pod_spec.get("nodeSelector") or {}),
            **admission.domains[slot],
        }
    if admission is not None and admission.tolerations:
        tolerations = list(pod_spec.get("tolerations") or [])
        pod_spec["tolerations"] = tolerations + [
            dict(t) for t in admission.tolerations if t not in tolerations
        ]
    volumes = _merge_named(pod_spec.get("volumes") or [], _volumes(job, role))
    if volumes:
        pod_spec["volumes"] = volumes

    container = _main_container(pod_spec, role)
    container.setdefault("image", job.spec.image)
    # A failed container's last log lines become its termination message, which
    # status.failures keeps after the pod is gone (lost launcher logs are a top
    # complaint about mpi-operator). The kubelet caps it at 80 lines / 2 KiB.
    container.setdefault("terminationMessagePolicy", "FallbackToLogsOnError")
    container["env"] = _merge_named(container.get("env") or [], _env(job, role, index))
    deadline = job.spec.run_policy.progress_deadline_seconds
    if deadline and not any(e.get("name") == STALL_CHECK_ENV for e in container["env"]):
        # Horovod's stall inspector names the ranks a hang waits for (progress.py
        # reads its report); a user's own setting stays.
        seconds = str(stall_check_seconds(deadline))
        container["env"].append({"name": STALL_CHECK_ENV, "value": seconds})
    mounts = _merge_named(
        container.get("volumeMounts") or [], _volume_mounts(job, role), key="mountPath"
    )
    if mounts:
        container["volumeMounts"] = mounts
    if job.spec.launch_mode == "gloo":
        _restrict(pod_spec)
    return metadata, pod_spec, container


def new_pod_group(job: HorovodJob, attempt: int, admission: Admission | None = None) -> Obj:
    """The workers' gang for one attempt (scheduling.k8s.io/v1beta1 PodGroup,
    KEP-4671): the kube-scheduler binds none of its pods until minCount of them
    fit at once, so two jobs that each get part of the GPUs cannot wait on each
    other forever. Its priority is the pods'."""
    name = job.metadata.name
    spec: Obj = {"schedulingPolicy": {"gang": {"minCount": job.spec.gang_size()}}}
    if job.spec.scheduling.priority_class_name and (
        admission is None or admission.pod_priority_class
    ):
        spec["priorityClassName"] = job.spec.scheduling.priority_class_name
    labels = {**names.role_labels(name, names.ROLE_WORKER), names.LABEL_ATTEMPT: str(attempt)}
    metadata = _metadata(job, names.pod_group_name(name, attempt, job.spec.gang_size()), labels)
    if podgroups.of(job) is not None:
        # Volcano's or coscheduling's group (podgroups.py), sized by what a worker requests.
        worker = new_worker_pod(job, 0, attempt, admission=admission)
        return podgroups.new_pod_group(job, metadata, worker)
    topology = job.spec.scheduling.topology
    if topology is not None and topology.mode == "Required":
        # The scheduler picks one domain where the whole group fits.
        spec["schedulingConstraints"] = {"topology": [{"key": topology.key}]}
    if job.spec.scheduling.gang.resource_claims:
        # Made (from templates) and reserved for the group, deleted with it.
        spec["resourceClaims"] = [c.reference() for c in job.spec.scheduling.gang.shared_claims()]
    return {
        "apiVersion": POD_GROUP_API_VERSION,
        "kind": "PodGroup",
        "metadata": metadata,
        "spec": spec,
    }


def new_worker_pod(
    job: HorovodJob,
    index: int,
    attempt: int,
    gang: bool = False,
    admission: Admission | None = None,
) -> Obj:
    """Worker pod `<job>-worker-<i>`, reachable as its hostname: sshd by default
    (mpi), or its own ranks behind horovod_worker.gloo_worker (gloo); with `gang`,
    a member of the attempt's PodGroup; with `admission`, placed where Kueue
    admitted the workers."""
    name = job.metadata.name
    labels = {
        **names.role_labels(name, names.ROLE_WORKER),
        names.LABEL_JOB_UID: job.metadata.uid,
        names.LABEL_WORKER_INDEX: str(index),
        names.LABEL_ATTEMPT: str(attempt),
    }
    template_meta, pod_spec, container = _pod_template(
        job, job.spec.worker.template, names.ROLE_WORKER, labels, index, admission
    )
    pod_spec["hostname"] = names.worker_name(name, index)
    pod_spec["subdomain"] = names.service_name(name)
    if gang and podgroups.of(job) is None:
        group = names.pod_group_name(name, attempt, job.spec.gang_size())
        pod_spec["schedulingGroup"] = {"podGroupName": group}
        shared = job.spec.scheduling.gang.shared_claims()
        if shared:
            # The group's claims, matched exactly: the pod uses the group's devices.
            pod_spec["resourceClaims"] = [
                *(pod_spec.get("resourceClaims") or []),
                *(c.reference() for c in shared),
            ]
            requirements = container.setdefault("resources", {})
            requirements["claims"] = [
                *(requirements.get("claims") or []),
                *({"name": c.name} for c in shared),
            ]

    resources = job.spec.worker.resources
    if resources is not None:
        merged: Obj = dict(container.get("resources") or {})
        for kind, values in (("limits", resources.limits), ("requests", resources.requests)):
            if values:
                merged[kind] = {**(merged.get(kind) or {}), **values}
        container["resources"] = merged
    if job.spec.elastic:
        # Ready while its agent can take ranks: the same question the launcher's
        # host discovery asks it, so Ready pods are the hosts Horovod trains on.
        container.setdefault("command", gloo_worker_command(job.spec))
        _add_port(container, "agent", contract.ELASTIC_AGENT_PORT)
        container.setdefault(
            "readinessProbe",
            {
                "httpGet": {
                    "path": contract.ELASTIC_READY_PATH,
                    "port": contract.ELASTIC_AGENT_PORT,
                },
                "periodSeconds": ELASTIC_READINESS_PERIOD_SECONDS,
                # A busy pod (its ranks training, a newcomer importing its
                # framework) may answer late; late is not gone.
                "timeoutSeconds": 5,
            },
        )
    elif job.spec.launch_mode == "gloo":
        # No sshd and no probe: Ready once running, when it waits for the launcher.
        container.setdefault("command", gloo_worker_command(job.spec))
    else:
        ours = not job.spec.ssh.image_managed() and "command" not in container
        if ours:
            container["command"] = list(contract.WORKER_SSHD_COMMAND)
        # Else an mpi-operator image runs its own sshd (the template's command, or
        # the image's entrypoint when the template has none), or the template's
        # command is its own: whether that has our module to wait with is unknown.
        port = job.spec.ssh_port()
        _add_port(container, "ssh", port)
        if "readinessProbe" not in container and "startupProbe" not in container:
            container.update(sshd_probe(port) if ours else image_sshd_probe(port))
    native_gang = gang and podgroups.of(job) is None
    if admission is None:
        # A job Kueue admits is placed by Kueue's Topology Aware Scheduling instead (its
        # Workload asks for the domain: new_workload).
        _add_topology_affinity(job, attempt, pod_spec, native_gang)
    metadata = _metadata(job, names.worker_name(name, index), template_meta["labels"])
    if "annotations" in template_meta:
        metadata["annotations"] = template_meta["annotations"]
    if gang:
        podgroups.join(job, attempt, metadata, pod_spec)  # Volcano's or coscheduling's group
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}


def _add_topology_affinity(job: HorovodJob, attempt: int, pod_spec: Obj, native_gang: bool) -> None:
    """spec.scheduling.topology as a pod affinity to the attempt's other workers, where
    the native gang's PodGroup does not carry it (Required there): required keeps a
    worker out of every domain but the first worker's (which matches its own term,
    so it goes anywhere), preferred only weighs the scheduler's choice."""
    topology = job.spec.scheduling.topology
    if topology is None or (native_gang and topology.mode == "Required"):
        return
    name = job.metadata.name
    selector = {**names.role_labels(name, names.ROLE_WORKER), names.LABEL_ATTEMPT: str(attempt)}
    term = {"labelSelector": {"matchLabels": selector}, "topologyKey": topology.key}
    affinity = pod_spec.setdefault("affinity", {}).setdefault("podAffinity", {})
    if topology.mode == "Required":
        key = "requiredDuringSchedulingIgnoredDuringExecution"
        affinity[key] = [*(affinity.get(key) or []), term]
    else:
        key = "preferredDuringSchedulingIgnoredDuringExecution"
        weighted = {"weight": 100, "podAffinityTerm": term}
        affinity[key] = [*(affinity.get(key) or []), weighted]


def sshd_probe(port: int) -> Obj:
    """The readiness probe of a worker running our sshd: Ready once sshd answers."""
    wait = SSHD_WAIT_SECONDS
    command = [*contract.WORKER_SSHD_COMMAND, "--port", str(port), "--wait-listening", str(wait)]
    return {
        "readinessProbe": {
            "exec": {"command": command},
            "periodSeconds": SSHD_RECHECK_SECONDS,
            # The kubelet's own limit on one run, above the command's.
            "timeoutSeconds": wait + 5,
        }
    }


def image_sshd_probe(port: int) -> Obj:
    """The readiness probe of a worker running an image's own sshd: a TCP connect."""
    return {
        "readinessProbe": {
            "tcpSocket": {"port": port},
            "periodSeconds": SSHD_READINESS_PERIOD_SECONDS,
        }
    }


def new_launcher_job(job: HorovodJob, attempt: int, admission: Admission | None = None) -> Obj:
    """batch/v1 Job `<job>-launcher` running horovodrun once (the operator retries);
    in gloo mode, the rendezvous server the workers' ranks meet at.

    backoffLimit 0: a failed launcher means a failed attempt, and the operator
    restarts the workers with it, which a Job controller retry could not do.
    """
    name = job.metadata.name
    labels = {
        **names.role_labels(name, names.ROLE_LAUNCHER),
        names.LABEL_JOB_UID: job.metadata.uid,
        names.LABEL_ATTEMPT: str(attempt),
    }
    template_meta, pod_spec, container = _pod_template(
        job, job.spec.launcher.template, names.ROLE_LAUNCHER, labels, admission=admission
    )
    if job.spec.launch_mode == "gloo":
        # Reachable as `<job>-launcher.<job>-worker.<ns>.svc`: the rendezvous.
        pod_spec["hostname"] = names.launcher_name(name)
        pod_spec["subdomain"] = names.service_name(name)
        container.setdefault(
            "command",
            elastic_launcher_command(job.spec) if job.spec.elastic else gloo_launcher_command(),
        )
        _add_port(container, "rendezvous", contract.GLOO_RENDEZVOUS_PORT)
    else:
        container.setdefault("command", launcher_command(job.spec))
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": _metadata(job, names.launcher_name(name), labels),
        "spec": {
            "backoffLimit": 0,
            "template": {"metadata": template_meta, "spec": pod_spec},
        },
    }


def _add_port(container: Obj, name: str, port: int) -> None:
    """Declare a container port the operator's processes listen on (replacing the
    template's entry for the same port)."""
    ports = [p for p in container.get("ports") or [] if p.get("containerPort") != port]
    container["ports"] = [*ports, {"name": name, "containerPort": port, "protocol": "TCP"}]


def _requests_from_limits(pod_spec: Obj) -> Obj:
    """Kueue counts requests; a container that sets only limits requests as much
    (what the API server defaults for a pod, and Kueue's jobs get from
    workload.AdjustResources; a Workload's template is not defaulted)."""
    spec = copy.deepcopy(pod_spec)
    for key in ("initContainers", "containers"):
        for container in spec.get(key) or ():
            resources = container.get("resources") or {}
            limits = resources.get("limits") or {}
            if limits:
                resources["requests"] = {**limits, **(resources.get("requests") or {})}
                container["resources"] = resources
    return spec


def new_workload(job: HorovodJob, attempt: int, priority: Priority | None) -> Obj:
    """The job's Kueue Workload (kueue.x-k8s.io/v1beta2): its workers and its
    launcher as two pod sets in spec.scheduling.queue, with the priority of
    spec.scheduling.priorityClassName. Kueue admits it whole or not at all."""
    name = job.metadata.name
    pod_priority_class = priority is None or priority.kind == "PriorityClass"
    unplaced = Admission(pod_priority_class=pod_priority_class)
    worker_spec = new_worker_pod(job, 0, attempt, admission=unplaced)["spec"]
    for per_pod in ("hostname", "subdomain"):
        worker_spec.pop(per_pod, None)
    launcher_spec = new_launcher_job(job, attempt, admission=unplaced)["spec"]["template"]["spec"]
    workers: Obj = {
        "name": names.ROLE_WORKER,
        "count": job.spec.worker_count(),
        "template": {"spec": _requests_from_limits(worker_spec)},
    }
    if job.spec.elastic is not None:
        # Kueue's partial admission: as many of maxReplicas as the quota allows, down
        # to minReplicas (the job then runs with the admitted count: HorovodJobSpec.admitted).
        workers["minCount"] = job.spec.elastic.min_replicas
    topology = job.spec.scheduling.topology
    if topology is not None:
        # Kueue's Topology Aware Scheduling admits the workers into one domain of the
        # key (Required) or as few as fit (Preferred); the pod-index label ranks them.
        workers["topologyRequest"] = {
            ("required" if topology.mode == "Required" else "preferred"): topology.key,
            "podIndexLabel": names.LABEL_WORKER_INDEX,
        }
    spec: Obj = {
        "queueName": job.spec.scheduling.queue,
        "podSets": [
            workers,
            {
                "name": names.ROLE_LAUNCHER,
                "count": 1,
                "template": {"spec": _requests_from_limits(launcher_spec)},
            },
        ],
    }
    if priority is not None:
        spec["priorityClassRef"] = {
            "group": priority.group,
            "kind": priority.kind,
            "name": priority.name,
        }
        spec["priority"] = priority.value
    return {
        "apiVersion": WORKLOAD_API_VERSION,
        "kind": "Workload",
        "metadata": _metadata(job, names.workload_name(name, attempt), names.base_labels(name)),
        "spec": spec,
    }
