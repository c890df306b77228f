"""The HorovodJob API (``horovod.ai/v1alpha1``): models, defaults and validation.

These pydantic models are the one source of truth: the CRD in ``crds/`` and the
reference in ``docs/api.md`` are generated from them (see :mod:`horovod_operator.crd`).
Field names are snake_case in Python and camelCase on the wire (aliases).

Validation is split in two, and both halves live here:

* Schema rules (types, ranges, enums, unknown fields) are also in the CRD, so the
  API server rejects them at apply time.
* Semantic rules (names too long for DNS, slots above GPUs, launch modes that do
  not exist yet) need the whole object; the operator checks them and reports
  ``Failed/InvalidSpec`` with the message from :func:`format_validation_error`.
"""

from __future__ import annotations

import re
from typing import Any, Final, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

GROUP: Final = "horovod.ai"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "HorovodJob"
PLURAL: Final = "horovodjobs"
SINGULAR: Final = "horovodjob"
SHORT_NAMES: Final = ("hvjob", "hj")

GPU_RESOURCE: Final = "nvidia.com/gpu"
DNS_LABEL_MAX: Final = 63
# A DNS-1035 label: the Service `<job>-worker` must start with a letter.
_DNS_1035_LABEL: Final = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_FIELD_PREFIX: Final = re.compile(r"^[A-Za-z][A-Za-z.]*: ")

Phase = Literal["Pending", "Starting", "Running", "Restarting", "Succeeded", "Failed", "Suspended"]
TERMINAL_PHASES: Final = frozenset({"Succeeded", "Failed"})


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
    """The worker pods: each runs sshd (by default) and hosts slotsPerWorker ranks."""

    replicas: int = Field(default=1, ge=1, description="Number of worker pods.")
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


class LauncherSpec(_Model):
    """The launcher: a batch/v1 Job that runs horovodrun against the workers."""

    template: dict[str, Any] | None = Field(
        default=None,
        description=(
            "A core/v1 PodTemplateSpec merged into the launcher pod. A command on its "
            "first container replaces the generated horovodrun command."
        ),
    )


class RunPolicy(_Model):
    """How the job runs, restarts, finishes and is cleaned up."""

    backoff_limit: int = Field(
        default=3, ge=0, description="Restarts allowed after a failure before the job fails."
    )
    active_deadline_seconds: int | None = Field(
        default=None,
        ge=1,
        description="Seconds from start after which the job fails with DeadlineExceeded.",
    )
    ttl_seconds_after_finished: int | None = Field(
        default=None, ge=0, description="Seconds after finishing after which the job is deleted."
    )
    clean_pod_policy: Literal["None", "Running", "All"] = Field(
        default="Running",
        description="Pods deleted when the job finishes: none, those still running, or all.",
    )
    launcher_creation_policy: Literal["WaitForWorkersReady", "AtStartup"] = Field(
        default="WaitForWorkersReady",
        description="Create the launcher once every worker is Ready, or at once.",
    )
    suspend: bool = Field(
        default=False,
        description="True deletes the pods and keeps the job (Kueue-compatible); false resumes.",
    )


class Scheduling(_Model):
    """Scheduling hints copied onto every pod."""

    scheduler_name: str | None = Field(default=None, description="spec.schedulerName of pods.")
    priority_class_name: str | None = Field(
        default=None, description="spec.priorityClassName of pods."
    )
    queue: str | None = Field(
        default=None, description="Kueue queue name, set as label kueue.x-k8s.io/queue-name."
    )


class HorovodJobSpec(_Model):
    """What the user asks for."""

    image: str = Field(
        default="",
        validate_default=True,
        description="Image of the launcher and the workers; empty: the operator's default "
        "image (--default-image, Helm value workerImage).",
    )
    command: list[str] = Field(
        min_length=1,
        description="Per-rank command; the operator prepends horovodrun with the rank count.",
    )
    slots_per_worker: int = Field(
        default=1, ge=1, description="Ranks per worker pod; at most its GPUs when GPUs are set."
    )
    launch_mode: Literal["mpi", "gloo"] = Field(
        default="mpi",
        description="mpi: the launcher runs horovodrun over ssh. gloo: not implemented yet.",
    )
    worker: WorkerSpec = Field(default_factory=WorkerSpec, description="The worker pods.")
    launcher: LauncherSpec = Field(default_factory=LauncherSpec, description="The launcher.")
    run_policy: RunPolicy = Field(default_factory=RunPolicy, description="Run policy.")
    scheduling: Scheduling = Field(default_factory=Scheduling, description="Scheduling hints.")

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
        if self.launch_mode == "gloo":
            raise ValueError(
                "launchMode: gloo is not supported yet (the SSH-free launch path comes "
                "in a later release); use launchMode: mpi"
            )
        gpus = self.worker.resources.gpus() if self.worker.resources else None
        if gpus is not None and self.slots_per_worker > gpus:
            raise ValueError(
                f"slotsPerWorker: {self.slots_per_worker} is more than the {gpus} GPU(s) "
                f"requested per worker in worker.resources; each rank needs its own GPU"
            )
        return self

    def total_slots(self) -> int:
        """The rank count: replicas x slotsPerWorker."""
        return self.worker.replicas * self.slots_per_worker


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


class Condition(_Model):
    """One condition: Created, Running, Restarting, Succeeded, Failed, Suspended, SpecRejected."""

    type: str = Field(description="Condition type.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(description="CamelCase reason, e.g. WorkerFailed.")
    message: str = Field(default="", description="Human-readable detail.")
    last_transition_time: str = Field(description="When status last changed (RFC 3339).")


class WorkerCounts(_Model):
    """Worker pods of the current attempt by state."""

    replicas: int = Field(default=0, description="Worker pods the job runs.")
    ready: int = Field(default=0, description="Worker pods Ready.")
    running: int = Field(default=0, description="Worker pods Running.")
    succeeded: int = Field(default=0, description="Worker pods Succeeded.")
    failed: int = Field(default=0, description="Worker pods Failed.")
    summary: str = Field(default="0/0", description="ready/replicas, for kubectl get.")


class LauncherStatus(_Model):
    """The launcher of the current attempt."""

    phase: str | None = Field(default=None, description="Pod phase of the launcher.")
    pod_name: str | None = Field(default=None, description="Name of the launcher pod.")
    exit_code: int | None = Field(default=None, description="Exit code once it terminated.")


class Failure(_Model):
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


class HorovodJobStatus(_Model):
    """What the operator observed; derived by status.compute_status."""

    phase: Phase | None = Field(default=None, description="Summary phase of the job.")
    conditions: list[Condition] = Field(default_factory=list, description="Conditions.")
    workers: WorkerCounts | None = Field(default=None, description="Worker counts.")
    launcher: LauncherStatus | None = Field(default=None, description="Launcher state.")
    failures: list[Failure] = Field(
        default_factory=list, description="Failed ranks of the last failed attempt."
    )
    restarts: int = Field(default=0, description="Restarts done so far.")
    start_time: str | None = Field(default=None, description="When the job (attempt) started.")
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
        check_job_name(self.metadata.name, self.spec.worker.replicas)
        return self


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
    Raises ValidationError; format it with :func:`format_validation_error`.
    """
    return HorovodJob.model_validate(body, context={"default_image": default_image})
