"""The HorovodJob API (``horovod.ai/v1alpha1``): models, defaults and validation.

These pydantic models are the one source of truth: the CRD in ``crds/`` and the
reference in ``docs/api.md`` are generated from them (see :mod:`horovod_operator.crd`).
Field names are snake_case in Python and camelCase on the wire (aliases).

Validation is split in two, and both halves live here:

* Schema rules (types, ranges, enums, unknown fields) are also in the CRD, so the
  API server rejects them at apply time.
* Rules across fields (slots above GPUs, a gang larger than the job, fields
  that cannot change once a job started) are CEL rules in the CRD too
  (:mod:`horovod_operator.validation`), so most bad edits are refused at
  apply time. The operator checks them again (a CRD from an older release may
  lack them) together with what CEL cannot see (names too long for DNS,
  templates that cannot be a PodTemplateSpec) and reports ``Failed/InvalidSpec``
  for a job that never started, ``SpecRejected`` for one that did.

Status is parsed apart from the spec and tolerantly: a field written by a newer
release of the operator is ignored, never a reason to fail a job.
"""

from __future__ import annotations

import re
import shlex
from typing import Any, Final, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

import horovod_contract as contract

from .validation import (
    GPU_RESOURCE,
    MANAGED_BY_RULES,
    SPEC_RULES,
    check_job_name,
    check_template_shape,
)

GROUP: Final = "horovod.ai"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "HorovodJob"
PLURAL: Final = "horovodjobs"
SINGULAR: Final = "horovodjob"
SHORT_NAMES: Final = ("hvjob", "hj")

_FIELD_PREFIX: Final = re.compile(r"^[A-Za-z][A-Za-z.]*: ")

Phase = Literal["Pending", "Starting", "Running", "Restarting", "Succeeded", "Failed", "Suspended"]
# The phase groups every module reads (named once, here).
TERMINAL_PHASES: Final = frozenset({"Succeeded", "Failed"})
# Phases in which pods of the job may exist and its shape is fixed.
STARTED_PHASES: Final = frozenset({"Pending", "Starting", "Running", "Restarting"})
# An attempt under way: not restarting, suspended or finished.
ATTEMPT_PHASES: Final = frozenset({"Pending", "Starting", "Running"})
# Before the attempt runs: its pods are being created, scheduled or started.
STARTING_PHASES: Final = frozenset({"Pending", "Starting"})

# Upper bounds, also in the CRD. Workers: each adds about 150 bytes to each of
# the two files of the job's ConfigMap, whose data the API server caps at 1 MiB.
MAX_REPLICAS: Final = 2048
MAX_SLOTS: Final = 64
MAX_BACKOFF_LIMIT: Final = 1000
# Durations: one year. Far beyond any training run, and far from the limits of
# datetime arithmetic (year 9999) and of asyncio timers.
MAX_SECONDS: Final = 366 * 24 * 3600
DEFAULT_STARTUP_TIMEOUT: Final = 1200
# Below this a healthy job's evaluation or checkpoint pause passes for a hang, and
# Horovod's stall inspector (a quarter of it) warns about ordinary slow steps.
MIN_PROGRESS_DEADLINE: Final = 60
# spec.managedBy of the jobs this operator runs (the field unset means the same).
# MultiKueue sets its own ("kueue.x-k8s.io/multikueue") on a job it dispatches.
MANAGED_BY: Final = "horovod.ai/horovod-operator"
# ssh's own default: where an mpi-operator image's sshd listens.
IMAGE_SSH_PORT: Final = 22


class _Model(BaseModel):
    """Base for spec models: camelCase on the wire, unknown fields are errors."""

    model_config = ConfigDict(
        extra="forbid",
        alias_generator=to_camel,
        populate_by_name=True,
        validate_assignment=False,
    )


class ResourceRequirements(_Model):
    """Compute resources of the worker container (a subset of core/v1 ResourceRequirements)."""

    limits: dict[str, int | str] | None = Field(
        default=None,
        description="Maximum resources, e.g. {nvidia.com/gpu: 1, memory: 8Gi}.",
    )
    requests: dict[str, int | str] | None = Field(
        default=None, description="Minimum resources; defaults to limits for extended resources."
    )

    def gpus(self) -> int | None:
        """GPUs per worker from limits (or requests); None when no GPU is asked for."""
        for source in (self.limits, self.requests):
            if source and GPU_RESOURCE in source:
                return int(str(source[GPU_RESOURCE]))
        return None

    @field_validator("limits", "requests")
    @classmethod
    def _gpu_is_whole(cls, value: dict[str, int | str] | None) -> dict[str, int | str] | None:
        if value and GPU_RESOURCE in value:
            gpus = str(value[GPU_RESOURCE])
            if not gpus.isdigit():
                raise ValueError(f"{GPU_RESOURCE} must be a whole number, got {gpus!r}")
        return value


class WorkerSpec(_Model):
    """The worker pods: each hosts slotsPerWorker ranks (started over ssh in mpi mode,
    by the pod itself in gloo mode)."""

    replicas: int = Field(
        default=1, ge=1, le=MAX_REPLICAS, description="Number of worker pods (at most 2048)."
    )
    resources: ResourceRequirements | None = Field(
        default=None, description="Resources of the worker container, GPUs included."
    )
    template: dict[str, Any] | None = Field(
        default=None,
        description=(
            "A core/v1 PodTemplateSpec merged into every worker pod: the operator's "
            "labels, hostname, volumes and environment are added to it."
        ),
    )

    # GPUs per worker from the template's DRA claims (claims.py): known only once the
    # executor has read the ResourceClaimTemplates, so not a field of the wire form.
    _claimed_gpus: int = PrivateAttr(default=0)

    @field_validator("template")
    @classmethod
    def _template_shape(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        check_template_shape(value)
        return value

    def gpus(self) -> int | None:
        """GPUs per worker: the device plugin's (worker.resources) and the DRA claims'
        together; None when neither asks for one."""
        plugin = self.resources.gpus() if self.resources else None
        if not self._claimed_gpus:
            return plugin
        return (plugin or 0) + self._claimed_gpus

    def with_claimed_gpus(self, gpus: int) -> WorkerSpec:
        """A copy that counts `gpus` claimed GPUs per worker."""
        copy = self.model_copy()
        copy._claimed_gpus = gpus
        return copy


# horovodrun options the operator writes itself from the job: a second value
# would contradict the rank count, the hostfile or the port.
GENERATED_HOROVODRUN_OPTIONS: Final = (
    "-np", "--num-proc", "-H", "--hosts", "-hostfile", "--hostfile",
    "-p", "--ssh-port", "--gloo", "--mpi", "--host-discovery-script",
)  # fmt: skip


# Open MPI parameters horovodrun always writes on its mpirun line; Open MPI
# refuses a parameter listed twice.
HOROVODRUN_MCA_PARAMS: Final = ("pml", "btl", "plm_rsh_args", "btl_tcp_if_include")


def mca_params(mpi_args: str) -> list[str]:
    """The names of the -mca/--mca parameters in an --mpi-args value."""
    try:
        words = shlex.split(mpi_args)
    except ValueError:
        return []
    return [words[i + 1] for i, word in enumerate(words[:-1]) if word in ("-mca", "--mca", "-gmca")]


class LauncherSpec(_Model):
    """The launcher: a batch/v1 Job that runs horovodrun against the workers (mpi), or
    serves the ranks' rendezvous (gloo)."""

    template: dict[str, Any] | None = Field(
        default=None,
        description=(
            "A core/v1 PodTemplateSpec merged into the launcher pod. A command on its "
            "first container replaces the generated one (horovodrun, or the gloo rendezvous)."
        ),
    )
    horovodrun_args: list[str] = Field(
        default_factory=list,
        max_length=64,
        description="Extra horovodrun options (launchMode mpi), placed after the generated "
        "-np, --hostfile, -p and --network-interfaces eth0 and before spec.command, e.g. "
        "['--fusion-threshold-mb', '32', '--mpi-args=-x NCCL_DEBUG=INFO -x NCCL_IB_DISABLE=1']. "
        "mpirun's own options go in one --mpi-args=... item. A --network-interfaces here "
        "replaces eth0 (pods on the cluster network have only eth0; with hostNetwork or a "
        "Multus network annotation the operator leaves the choice to horovodrun's discovery).",
    )

    @field_validator("horovodrun_args")
    @classmethod
    def _not_generated(cls, value: list[str]) -> list[str]:
        for arg in value:
            option = arg.split("=", 1)[0]
            if option in GENERATED_HOROVODRUN_OPTIONS:
                raise ValueError(
                    f"{option!r} is written by the operator from the job (-np from "
                    "worker.replicas x slotsPerWorker, the hostfile, the ssh port, the "
                    "launch mode); remove it"
                )
            if option == "--mpi-args":
                twice = [m for m in mca_params(arg.partition("=")[2]) if m in HOROVODRUN_MCA_PARAMS]
                if twice:
                    raise ValueError(
                        f"--mpi-args sets MCA parameter {twice[0]!r}, which horovodrun already "
                        "writes on its mpirun line (-mca pml ob1 -mca btl ^openib, the ssh "
                        "arguments, the interfaces), and Open MPI refuses a parameter listed "
                        "twice; remove it (--network-interfaces chooses the interfaces)"
                    )
        return value

    @field_validator("template")
    @classmethod
    def _template_shape(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        check_template_shape(value)
        return value


class OnExitCodes(_Model):
    """Matches a failed container by its exit code."""

    container_name: str | None = Field(
        default=None, description="Only this container (worker or launcher); default: any."
    )
    operator: Literal["In", "NotIn"] = Field(description="In or NotIn the values.")
    values: list[int] = Field(
        min_length=1, max_length=255, description="Exit codes; 0 never matches NotIn."
    )


class OnPodCondition(_Model):
    """Matches a failed pod by a condition it carries, e.g. DisruptionTarget."""

    type: str = Field(description="Pod condition type, e.g. DisruptionTarget.")
    status: Literal["True", "False", "Unknown"] = Field(default="True", description="Its status.")


class PodFailurePolicyRule(_Model):
    """One rule: an action, and what it matches (exit codes or pod conditions)."""

    action: Literal["Ignore", "Count", "FailJob"] = Field(
        description="Ignore: restart without counting against backoffLimit. Count: restart "
        "and count. FailJob: fail the job at once."
    )
    on_exit_codes: OnExitCodes | None = Field(default=None, description="Match by exit code.")
    on_pod_conditions: list[OnPodCondition] | None = Field(
        default=None, max_length=20, description="Match by pod conditions (any of them)."
    )

    @model_validator(mode="after")
    def _one_matcher(self) -> PodFailurePolicyRule:
        if (self.on_exit_codes is None) == (self.on_pod_conditions is None):
            raise ValueError("set exactly one of onExitCodes and onPodConditions")
        return self


class PodFailurePolicy(_Model):
    """What a failed pod means for the job, like batch/v1 Job's podFailurePolicy.

    The first rule matching a failed pod decides. When none matches, a disruption
    (DisruptionTarget condition: preemption, eviction, drain; a pod evicted by
    the kubelet; a pod deleted by anyone but the operator) restarts the job
    without counting, and any other failure counts against backoffLimit.
    """

    rules: list[PodFailurePolicyRule] = Field(
        default_factory=list, max_length=20, description="Rules, first match wins."
    )


class RunPolicy(_Model):
    """How the job runs, restarts, finishes and is cleaned up."""

    backoff_limit: int = Field(
        default=3,
        ge=0,
        le=MAX_BACKOFF_LIMIT,
        description="Counted restarts allowed before the job fails (disruptions and "
        "failures a podFailurePolicy rule ignores are not counted).",
    )
    pod_failure_policy: PodFailurePolicy | None = Field(
        default=None, description="What failed pods mean: ignore, count or fail the job."
    )
    active_deadline_seconds: int | None = Field(
        default=None,
        ge=1,
        le=MAX_SECONDS,
        description="Seconds from status.startTime after which the job fails with "
        "DeadlineExceeded. Suspending stops the clock; resuming starts it again from zero.",
    )
    startup_timeout_seconds: int | None = Field(
        default=DEFAULT_STARTUP_TIMEOUT,
        ge=1,
        le=MAX_SECONDS,
        description="Seconds an attempt may take from its first pod to a running launcher "
        "before the job fails with StartupTimeout, naming what it waited for (an "
        "unschedulable pod, an image pull). The default, 20 minutes, covers a cluster "
        "autoscaler adding a GPU node and a multi-GB image pull, and frees the GPUs the "
        "other pods hold within the hour. null disables it.",
    )
    ttl_seconds_after_finished: int | None = Field(
        default=None,
        ge=0,
        le=MAX_SECONDS,
        description="Seconds after status.completionTime after which the job is deleted.",
    )
    clean_pod_policy: Literal["None", "Running", "All"] = Field(
        default="Running",
        description=(
            "Pods deleted when the job finishes: none, those still running, or all "
            "(the workers in one collection delete)."
        ),
    )
    launcher_creation_policy: Literal["WaitForWorkersReady", "AtStartup"] = Field(
        default="WaitForWorkersReady",
        description="Create the launcher once every worker is Ready, or at once.",
    )
    suspend: bool = Field(
        default=False,
        description="True deletes the pods and keeps the job; false resumes.",
    )
    progress_deadline_seconds: int | None = Field(
        default=None,
        ge=MIN_PROGRESS_DEADLINE,
        le=MAX_SECONDS,
        description="Seconds a training that reported progress (HVJOB_PROGRESS lines, "
        "docs/progress.md) may go without a new step before its attempt ends as Hung, "
        "naming the silent ranks. Horovod's stall inspector then warns after a quarter "
        "of it. Longer than the longest pause between steps (evaluation, checkpoints). "
        "null: no hang detection.",
    )
    progress_deadline_action: Literal["Count", "FailJob", "Ignore"] = Field(
        default="Count",
        description="What a Hung attempt means, as a podFailurePolicy action: restart "
        "counting against backoffLimit (Count), fail the job (FailJob), or restart "
        "without counting (Ignore).",
    )


class GangResourceClaim(_Model):
    """A ResourceClaim that the gang's PodGroup holds and every worker shares
    (Kubernetes 1.37's DRAWorkloadResourceClaims): one set of devices for the whole
    attempt, e.g. an NVLink ComputeDomain channel."""

    name: str = Field(
        max_length=63,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        description="The claim's name in the PodGroup and in every worker pod (a DNS label); "
        "the worker container gets it in resources.claims.",
    )
    resource_claim_template_name: str | None = Field(
        default=None,
        max_length=253,
        description="A ResourceClaimTemplate: the control plane makes one claim from it per "
        "attempt's PodGroup and deletes it with the group.",
    )
    resource_claim_name: str | None = Field(
        default=None, max_length=253, description="An existing ResourceClaim, shared as it is."
    )

    @model_validator(mode="after")
    def _one_source(self) -> GangResourceClaim:
        if (self.resource_claim_template_name is None) == (self.resource_claim_name is None):
            raise ValueError("set exactly one of resourceClaimTemplateName and resourceClaimName")
        return self

    def reference(self) -> dict[str, str]:
        """The claim as the PodGroup and the pods write it (they must match exactly)."""
        ref = {"name": self.name}
        if self.resource_claim_template_name is not None:
            ref["resourceClaimTemplateName"] = self.resource_claim_template_name
        if self.resource_claim_name is not None:
            ref["resourceClaimName"] = self.resource_claim_name
        return ref


class GangScheduling(_Model):
    """All or nothing: the workers are placed together or not at all."""

    policy: Literal["Auto", "Native", "Volcano", "Coscheduling", "None"] = Field(
        default="Auto",
        description="Auto: a native gang (a scheduling.k8s.io/v1beta1 PodGroup the "
        "kube-scheduler places all-or-nothing) when the cluster serves that API, else "
        "none. Native: require it; the job waits (Stalled/GangSchedulingUnavailable) on a "
        "cluster without it. Volcano: a scheduling.volcano.sh/v1beta1 PodGroup (queue: "
        "spec.scheduling.queue) and schedulerName volcano (docs/scheduling.md#volcano). "
        "Coscheduling: a scheduling.x-k8s.io/v1alpha1 PodGroup of scheduler-plugins and "
        "schedulerName scheduler-plugins-scheduler "
        "(docs/scheduling.md#scheduler-plugins-coscheduling). Both wait like Native where "
        "their CRD is not served; spec.scheduling.schedulerName overrides the scheduler. "
        "None: every pod is scheduled on its own. The launcher is not in the group: it "
        "starts only once the workers run.",
    )
    min_available: int | None = Field(
        default=None,
        ge=1,
        le=MAX_REPLICAS,
        description="Workers that must be placeable at once before any is bound "
        "(default: all of them). The schedule timeout is runPolicy.startupTimeoutSeconds: "
        "a gang that cannot be placed fails then, naming what the scheduler said.",
    )
    resource_claims: list[GangResourceClaim] | None = Field(
        default=None,
        max_length=4,
        description="DRA claims the native gang's PodGroup holds and every worker shares "
        "(Kubernetes 1.37, DRAWorkloadResourceClaims feature gate; docs/dra.md). They need "
        "the native gang: the job waits (Stalled/GangSchedulingUnavailable) where it is not "
        "served, and fails as InvalidSpec where the API server drops the field.",
    )

    def shared_claims(self) -> list[GangResourceClaim]:
        return self.resource_claims or []

    def needs_native(self) -> bool:
        """Whether only the native gang will do: Native, or Auto with shared claims
        (without the PodGroup each pod would make its own claim from the template)."""
        return self.policy == "Native" or (self.policy == "Auto" and bool(self.resource_claims))


class Topology(_Model):
    """Keep the workers in one topology domain (a rack, an NVLink block): Horovod's
    ring allreduce slows down when neighbouring ranks cross domains."""

    key: str = Field(
        max_length=317,
        pattern=r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$",
        description="The node label whose value names the domain, e.g. "
        "topology.kubernetes.io/rack.",
    )
    mode: Literal["Required", "Preferred"] = Field(
        default="Required",
        description="Required: every worker in one domain, or the job waits (with the native "
        "gang the scheduler picks a domain where the whole gang fits: the PodGroup's "
        "topology constraint, Kubernetes 1.37's TopologyAwareWorkloadScheduling gate; "
        "otherwise a required pod affinity to the attempt's other workers). Preferred: "
        "as few domains as the free capacity allows (a preferred pod affinity). A job in a "
        "Kueue queue is placed by Kueue's Topology Aware Scheduling instead: its Workload "
        "asks for the key (a level of the flavor's Topology) and each worker goes to its "
        "slot of Kueue's assignment, in worker-index order.",
    )


class Scheduling(_Model):
    """Scheduling hints copied onto every pod, and gang scheduling."""

    topology: Topology | None = Field(
        default=None,
        description="Place the workers in one topology domain "
        "(docs/scheduling.md#topology-the-workers-in-one-rack).",
    )

    gang: GangScheduling = Field(
        default_factory=GangScheduling, description="Gang (all-or-nothing) scheduling."
    )

    scheduler_name: str | None = Field(default=None, description="spec.schedulerName of pods.")
    priority_class_name: str | None = Field(
        default=None,
        description="spec.priorityClassName of pods. With Kueue, the Workload's priority: a "
        "WorkloadPriorityClass of this name (then not set on pods), else the PriorityClass.",
    )
    queue: str | None = Field(
        default=None,
        description="With gang.policy Volcano: the Volcano Queue of the job's PodGroup "
        "(Kueue then does not admit the job). Otherwise a Kueue LocalQueue. Where the "
        "cluster serves Kueue's Workload API the job is admitted as one Workload "
        "(workers and launcher): Suspended/QueuedByKueue with no pods until Kueue admits "
        "it, on the admitted flavors' nodes, suspended again when evicted "
        "(docs/kueue.md). Elsewhere it is only the pods' label kueue.x-k8s.io/queue-name.",
    )


class SSHSpec(_Model):
    """How the launcher's horovodrun reaches the workers (launchMode mpi)."""

    auth_mount_path: str | None = Field(
        default=None,
        pattern=r"^/",
        description="For images built for kubeflow/mpi-operator (its sshAuthMountPath): the "
        "job's key pair is mounted here as mpi-operator mounts it (id_rsa, id_rsa.pub, "
        "authorized_keys; mode 0600), the workers run their template's command or the "
        "image's entrypoint (their sshd), and the launcher runs plain horovodrun. Unset: the "
        "operator's worker image contract (horovod_worker.sshd on port 2222, docs/images.md).",
    )
    port: int | None = Field(
        default=None,
        ge=1,
        le=65535,
        description="Port of the image's sshd, with authMountPath (default 22, ssh's own).",
    )

    def image_managed(self) -> bool:
        """The image brings its own sshd and ssh setup (mpi-operator's contract)."""
        return self.auth_mount_path is not None


class ElasticPolicy(_Model):
    """Elastic training: the job trains with the workers that are Ready, between
    minReplicas and maxReplicas, and goes on when one is lost or another arrives
    (Horovod elastic, launchMode gloo; docs/elastic.md)."""

    min_replicas: int = Field(
        ge=1,
        le=MAX_REPLICAS,
        description="Fewest workers the job trains with. Below it for timeoutSeconds, the "
        "attempt fails (and restarts within runPolicy.backoffLimit).",
    )
    max_replicas: int = Field(
        ge=1,
        le=MAX_REPLICAS,
        description="Most workers: the operator keeps this many worker pods; those the "
        "scheduler cannot place yet wait, and join the training when they are Ready. "
        "worker.replicas is the count the training starts with (at least minReplicas).",
    )
    timeout_seconds: int = Field(
        default=600,
        ge=1,
        le=MAX_SECONDS,
        description="Seconds the job may have fewer than minReplicas workers Ready, at "
        "the start or later, before the attempt fails (Horovod's elastic timeout).",
    )
    reset_limit: int | None = Field(
        default=None,
        ge=0,
        le=MAX_BACKOFF_LIMIT,
        description="Most resets (each change of the set of workers is one) before the "
        "attempt fails; null: no limit.",
    )


class HorovodJobSpec(_Model):
    """What the user asks for."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": SPEC_RULES})

    image: str = Field(
        default="",
        validate_default=True,
        description="Image of the launcher and the workers; empty: the operator's default "
        "image (--default-image, Helm value workerImage).",
    )
    command: list[str] = Field(
        min_length=1,
        description="Per-rank command; the operator prepends horovodrun with the rank count "
        "(mpi), or the worker's rank starter (gloo).",
    )
    slots_per_worker: int = Field(
        default=1,
        ge=1,
        le=MAX_SLOTS,
        description="Ranks per worker pod; at most its GPUs when GPUs are set.",
    )
    launch_mode: Literal["mpi", "gloo"] = Field(
        default="mpi",
        description="mpi: the launcher runs horovodrun, which starts the ranks over ssh "
        "(Open MPI, sshd in the workers). gloo: no ssh, keys or Open MPI; the launcher serves "
        "Horovod's Gloo rendezvous, each worker starts its own ranks, and the pods run as the "
        "image's non-root user under PodSecurity restricted (docs/gloo.md).",
    )
    worker: WorkerSpec = Field(default_factory=WorkerSpec, description="The worker pods.")
    launcher: LauncherSpec = Field(default_factory=LauncherSpec, description="The launcher.")
    run_policy: RunPolicy = Field(default_factory=RunPolicy, description="Run policy.")
    scheduling: Scheduling = Field(default_factory=Scheduling, description="Scheduling hints.")
    ssh: SSHSpec = Field(
        default_factory=SSHSpec, description="ssh between launcher and workers (mpi mode)."
    )
    elastic: ElasticPolicy | None = Field(
        default=None,
        description="Elastic training (launchMode gloo): the job shrinks when a worker is "
        "lost and grows when capacity frees, between minReplicas and maxReplicas, instead "
        "of restarting (docs/elastic.md).",
    )
    managed_by: str | None = Field(
        default=None,
        max_length=63,
        pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$",
        description=f"The controller that runs this job: unset or {MANAGED_BY} for this "
        "operator. kueue.x-k8s.io/multikueue: MultiKueue runs it on a worker cluster and "
        "mirrors its status here, where this operator creates only its Kueue Workload "
        "(docs/kueue.md). Any other value: this operator leaves the job, its status "
        "included, to that controller. Immutable.",
        json_schema_extra={"x-kubernetes-validations": MANAGED_BY_RULES},
    )

    @field_validator("image")
    @classmethod
    def _image_or_default(cls, value: str, info: ValidationInfo) -> str:
        if value:
            return value
        default = str((info.context or {}).get("default_image") or "")
        if not default:
            raise ValueError(
                "no image: set spec.image, or start the operator with --default-image "
                "(Helm value workerImage)"
            )
        return default

    @model_validator(mode="after")
    def _semantics(self) -> HorovodJobSpec:
        self._elastic_semantics()
        wanted = self.scheduling.gang.min_available
        if wanted is not None and wanted > self.worker_count():
            counted = "elastic.maxReplicas" if self.elastic else "worker.replicas"
            raise ValueError(
                f"scheduling.gang.minAvailable: {wanted} is more than {counted} "
                f"({self.worker_count()}); at most every worker can be placed"
            )
        self._gang_claims_semantics()
        if self.launch_mode == "gloo":
            for used, name in (
                (self.launcher.horovodrun_args, "launcher.horovodrunArgs"),
                (self.ssh.auth_mount_path, "ssh.authMountPath"),
            ):
                if used:
                    raise ValueError(
                        f"{name}: launchMode gloo runs no horovodrun and no ssh; remove it, "
                        "or use launchMode mpi"
                    )
        if self.ssh.port is not None and not self.ssh.image_managed():
            raise ValueError(
                "ssh.port: only an image's own sshd (ssh.authMountPath) listens elsewhere; the "
                f"operator's worker sshd listens on {contract.SSH_PORT}; remove ssh.port or set "
                "ssh.authMountPath"
            )
        gpus = self.worker.resources.gpus() if self.worker.resources else None
        if gpus is not None and self.slots_per_worker > gpus:
            raise ValueError(
                f"slotsPerWorker: {self.slots_per_worker} is more than the {gpus} GPU(s) "
                f"requested per worker in worker.resources; each rank needs its own GPU"
            )
        return self

    def _gang_claims_semantics(self) -> None:
        gang = self.scheduling.gang
        if not gang.resource_claims:
            return
        if gang.policy not in ("Auto", "Native"):
            raise ValueError(
                f"scheduling.gang.resourceClaims: only the native gang's PodGroup shares "
                f"claims, and gang.policy is {gang.policy}; set it to Native (or Auto), or "
                "remove the claims"
            )
        names = [claim.name for claim in gang.shared_claims()]
        own = {
            str(claim.get("name"))
            for claim in ((self.worker.template or {}).get("spec") or {}).get("resourceClaims")
            or ()
            if isinstance(claim, dict)
        }
        for name in names:
            if names.count(name) > 1 or name in own:
                raise ValueError(
                    f"scheduling.gang.resourceClaims: the name {name!r} is used twice (here or "
                    "in spec.worker.template.spec.resourceClaims); a pod's claims need one name "
                    "each"
                )

    def _elastic_semantics(self) -> None:
        elastic = self.elastic
        if elastic is None:
            return
        if self.launch_mode != "gloo":
            raise ValueError(
                "elastic: needs launchMode gloo (Horovod's elastic training runs on Gloo, "
                "and the workers' agents start the ranks instead of ssh); set launchMode: gloo"
            )
        replicas = self.worker.replicas
        if not elastic.min_replicas <= replicas <= elastic.max_replicas:
            raise ValueError(
                f"worker.replicas: {replicas} is outside elastic.minReplicas.."
                f"elastic.maxReplicas ({elastic.min_replicas}..{elastic.max_replicas}); it is "
                "the count the training starts with"
            )

    def worker_count(self) -> int:
        """The worker pods the job keeps: maxReplicas when elastic, else replicas."""
        return self.elastic.max_replicas if self.elastic else self.worker.replicas

    def admitted(self, workers: int) -> HorovodJobSpec:
        """This spec for an elastic job that Kueue admitted with `workers` of its
        maxReplicas (partial admission, down to minReplicas): at most that many
        workers, starting with no more."""
        if self.elastic is None or workers >= self.elastic.max_replicas:
            return self
        elastic = self.elastic.model_copy(update={"max_replicas": workers})
        worker = self.worker.model_copy(update={"replicas": min(self.worker.replicas, workers)})
        return self.model_copy(update={"elastic": elastic, "worker": worker})

    def ssh_port(self) -> int:
        """The port the workers' sshd listens on."""
        if self.ssh.image_managed():
            return self.ssh.port or IMAGE_SSH_PORT
        return contract.SSH_PORT

    def total_slots(self) -> int:
        """The rank count: replicas x slotsPerWorker."""
        return self.worker.replicas * self.slots_per_worker

    def gang_size(self) -> int:
        """The workers the gang needs placeable at once (an elastic job's minimum)."""
        fewest = self.elastic.min_replicas if self.elastic else self.worker.replicas
        return self.scheduling.gang.min_available or fewest


class ObjectMeta(BaseModel):
    """The parts of metadata the operator reads; the rest is ignored."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True, alias_generator=to_camel)

    name: str
    namespace: str = "default"
    uid: str = ""
    generation: int = 0
    resource_version: str | None = None
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    deletion_timestamp: str | None = None


class _StatusModel(BaseModel):
    """Base for status models: camelCase, and fields this release does not know are
    ignored (a newer operator may have written them before a rollback)."""

    model_config = ConfigDict(extra="ignore", alias_generator=to_camel, populate_by_name=True)


class Condition(_StatusModel):
    """One condition: Created, Running, Restarting, Succeeded, Failed, Suspended, SpecRejected."""

    type: str = Field(description="Condition type.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(description="CamelCase reason, e.g. WorkerFailed.")
    message: str = Field(default="", description="Human-readable detail.")
    last_transition_time: str = Field(description="When status last changed (RFC 3339).")


class WorkerCounts(_StatusModel):
    """Worker pods of the current attempt by state."""

    replicas: int = Field(default=0, description="Worker pods the job runs.")
    ready: int = Field(default=0, description="Worker pods Ready.")
    running: int = Field(default=0, description="Worker pods Running.")
    succeeded: int = Field(default=0, description="Worker pods Succeeded.")
    failed: int = Field(default=0, description="Worker pods Failed.")
    summary: str = Field(default="0/0", description="ready/replicas, for kubectl get.")


class LauncherStatus(_StatusModel):
    """The launcher of the current attempt."""

    phase: str | None = Field(default=None, description="Pod phase of the launcher.")
    pod_name: str | None = Field(default=None, description="Name of the launcher pod.")
    exit_code: int | None = Field(default=None, description="Exit code once it terminated.")


class Failure(_StatusModel):
    """A failed rank: which pod and container died, and why."""

    pod: str = Field(description="Pod name.")
    container: str | None = Field(default=None, description="Container name.")
    exit_code: int | None = Field(default=None, description="Exit code, e.g. 137.")
    reason: str | None = Field(default=None, description="OOMKilled, Evicted, Error, ...")
    message: str | None = Field(
        default=None,
        description="The container's termination message: with the operator's default "
        "terminationMessagePolicy, the last lines of its log (at most 80 lines, 2 KiB).",
    )


class LostWorker(_StatusModel):
    """A worker pod an elastic job lost and replaced."""

    pod: str = Field(description="Pod name.")
    uid: str = Field(default="", description="Pod UID (the replacement has the same name).")
    reason: str | None = Field(default=None, description="Error, OOMKilled, PodDeleted, ...")
    exit_code: int | None = Field(default=None, description="Exit code, if it exited.")
    message: str | None = Field(default=None, description="The termination message.")
    time: str = Field(description="When the operator saw it lost (RFC 3339).")
    counted: bool = Field(
        default=False, description="Whether it counts against runPolicy.backoffLimit."
    )


class ElasticStatus(_StatusModel):
    """An elastic job's size (docs/elastic.md); its changes are Events."""

    workers: int = Field(
        default=0,
        description="Workers Ready now: the hosts Horovod's driver sees, which the ranks "
        "train on from their next commit.",
    )
    resizes: int = Field(default=0, description="Changes of that count while Running.")
    last_resize_time: str | None = Field(default=None, description="When it last changed.")
    worker_failures: int = Field(
        default=0,
        description="Worker pods that failed and were replaced; each counts against "
        "runPolicy.backoffLimit (deletions, evictions and other disruptions do not).",
    )
    lost_workers: list[LostWorker] = Field(
        default_factory=list, description="The last worker pods lost (at most 20)."
    )
    attempt: int = Field(default=0, description="The attempt workerUids are of.")
    worker_uids: dict[str, str] = Field(
        default_factory=dict,
        description="The worker pods of this attempt last seen (name: the start of its UID), "
        "so that one gone without a trace is still named as lost.",
    )


class HungStatus(_StatusModel):
    """Why the attempt was found hung."""

    time: str = Field(description="When the operator found it (RFC 3339).")
    message: str = Field(description="What went silent, and what named it.")
    ranks: list[int] = Field(
        default_factory=list, description="The ranks named (Horovod's stall inspector)."
    )
    pods: list[str] = Field(default_factory=list, description="The pods those ranks run in.")


class ProgressStatus(_StatusModel):
    """How the training goes, from rank 0's HVJOB_PROGRESS lines (docs/progress.md)."""

    attempt: int = Field(default=0, description="The attempt these numbers are of.")
    step: int | None = Field(default=None, description="The latest step rank 0 reported.")
    epoch: int | None = Field(default=None, description="Its epoch, where reported.")
    samples_per_second: float | None = Field(
        default=None, description="The whole job's samples per second, between two reports."
    )
    world_size: int | None = Field(
        default=None, description="The size of the Horovod world the ranks report."
    )
    last_progress_time: str | None = Field(
        default=None, description="When the step last moved (the log line's time)."
    )
    hung: HungStatus | None = Field(
        default=None,
        description="Set when runPolicy.progressDeadlineSeconds passed without a new step.",
    )


class HorovodJobStatus(_StatusModel):
    """What the operator observed; derived by phases.compute_status and decide.decide."""

    phase: Phase | None = Field(default=None, description="Summary phase of the job.")
    conditions: list[Condition] = Field(default_factory=list, description="Conditions.")
    workers: WorkerCounts | None = Field(default=None, description="Worker counts.")
    launcher: LauncherStatus | None = Field(default=None, description="Launcher state.")
    failures: list[Failure] = Field(
        default_factory=list,
        description="Failed ranks of the last failed attempt: at most 10, the first to "
        "fail first (the message counts the rest).",
    )
    reason: str | None = Field(
        default=None,
        description="Why the job is in its phase, or what it waits for (kubectl get shows it).",
    )
    message: str | None = Field(default=None, description="The detail of reason.")
    restarts: int = Field(
        default=0, description="Restarts done so far (the current attempt's number)."
    )
    uncounted_restarts: int = Field(
        default=0,
        description="Restarts after disruptions or ignored failures; restarts minus these "
        "count against backoffLimit.",
    )
    start_time: str | None = Field(
        default=None,
        description="When the job started (or was last resumed); activeDeadlineSeconds "
        "counts from here.",
    )
    attempt_start_time: str | None = Field(
        default=None,
        description="When the current attempt started; startupTimeoutSeconds counts from here.",
    )
    elastic: ElasticStatus | None = Field(
        default=None, description="An elastic job's size and lost workers."
    )
    first_step_time: str | None = Field(
        default=None,
        description="When rank 0 started its first training step (its HVJOB_RANK line, read "
        "from the log; docs/metrics.md).",
    )
    progress: ProgressStatus | None = Field(
        default=None,
        description="The training's latest reported step, speed and world size (read from "
        "rank 0's log; docs/progress.md).",
    )
    completion_time: str | None = Field(default=None, description="When the job finished.")
    observed_generation: int | None = Field(
        default=None, description="metadata.generation last acted on."
    )


class HorovodJob(BaseModel):
    """A whole HorovodJob object as the operator reads it."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True, alias_generator=to_camel)

    api_version: str = API_VERSION
    kind: str = KIND
    metadata: ObjectMeta
    spec: HorovodJobSpec
    status: HorovodJobStatus | None = None

    @model_validator(mode="after")
    def _names_fit(self) -> HorovodJob:
        check_job_name(self.metadata.name, self.spec.worker_count())
        return self


def format_validation_error(error: ValidationError) -> str:
    """One line per problem, each naming the field (camelCase path) and the reason.

    Messages of the validators above start with the field they are about,
    relative to the model that raised them (``launchMode: ...``); the location
    of that model is prefixed so that every line names a full path.
    """
    lines = []
    for item in error.errors():
        path = ".".join(str(part) for part in item["loc"])
        message = item["msg"].removeprefix("Value error, ")
        if _FIELD_PREFIX.match(message):
            lines.append(f"{path}.{message}" if path else message)
        else:
            lines.append(f"{path}: {message}" if path else message)
    return "; ".join(lines)


def parse_job(body: Any, default_image: str | None = None) -> HorovodJob:
    """Validate a HorovodJob body (a mapping from the API server).

    `default_image` fills an empty spec.image (the operator's --default-image).
    The status is parsed apart (:func:`parse_status`), so no status field can
    make a spec invalid. Raises ValidationError for the spec and metadata;
    format it with :func:`format_validation_error`.
    """
    without_status = {key: value for key, value in dict(body).items() if key != "status"}
    job = HorovodJob.model_validate(without_status, context={"default_image": default_image})
    job.status = parse_status(body.get("status"))
    return job


def parse_status(raw: Any) -> HorovodJobStatus | None:
    """The stored status, tolerantly: unknown fields are ignored, and a field whose
    value this release cannot read is dropped instead of failing the job."""
    if not raw or not isinstance(raw, dict):
        return None
    data = dict(raw)
    for _ in range(len(data) + 1):
        try:
            return HorovodJobStatus.model_validate(data)
        except ValidationError as error:
            bad = {str(item["loc"][0]) for item in error.errors() if item["loc"]}
            if not bad & set(data):
                break
            data = {key: value for key, value in data.items() if key not in bad}
    return HorovodJobStatus()


def manager_of(body: Any) -> str | None:
    """The controller a stored job is left to (its spec.managedBy), or None when this
    operator runs it. Read from the raw body: a job left to another controller is
    not validated, reconciled or written by this one at all."""
    spec = body.get("spec") if isinstance(body, dict) else None
    value = spec.get("managedBy") if isinstance(spec, dict) else None
    if not value or value == MANAGED_BY:
        return None
    return str(value)
