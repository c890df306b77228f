"""`hvjob convert`: a kubeflow MPIJob (kubeflow.org/v2beta1, and v1's shape) as a
HorovodJob, with a warning for everything that does not carry over.

What maps (docs/migrating-from-mpijob.md has the table): names and labels,
slotsPerWorker, the Worker replicas, image, resources and pod template (its
sshd command included), sshAuthMountPath, the per-rank program at the end of
the launcher's `mpirun`/`horovodrun` command and its other options
(launcher.horovodrunArgs; the operator writes `-np` and the hostfile itself),
the launcher's env, runPolicy
(backoffLimit, activeDeadlineSeconds, ttlSecondsAfterFinished, cleanPodPolicy,
suspend, launcherCreationPolicy), schedulingPolicy (queue, priorityClass,
minAvailable). Pure: YAML in, (HorovodJob, warnings) out.
"""

from __future__ import annotations

import copy
import shlex
from typing import Any, Final

from .. import names
from ..api import API_VERSION, GENERATED_HOROVODRUN_OPTIONS, HOROVODRUN_MCA_PARAMS, KIND
from ..validation import GPU_RESOURCE

Obj = dict[str, Any]

# mpi-operator's default sshAuthMountPath.
MPI_OPERATOR_SSH_PATH: Final = "/root/.ssh"
# The value an MPIJob carries when mpi-operator itself runs it.
MPI_OPERATOR_MANAGER: Final = "kubeflow.org/mpi-operator"
LAUNCHERS: Final = ("mpirun", "mpiexec", "horovodrun", "orterun")
# Options of mpirun/horovodrun that take a value, so the program starts after it.
_WITH_VALUE: Final = {
    "-np", "-n", "-c", "--np", "-H", "--host", "-host", "--hostfile", "-hostfile",
    "--machinefile", "-machinefile", "-bind-to", "--bind-to", "-map-by", "--map-by",
    "-rank-by", "--rank-by", "-x", "-mca", "--mca", "-gmca", "--gmca", "-p", "--ssh-port",
    "--network-interface", "--network-interfaces", "--start-timeout", "--output-filename",
    "-wdir", "--wdir", "-npernode", "--npernode", "-N", "--gloo-timeout-seconds",
    "--log-level", "--timeline-filename", "--cycle-time-ms", "--cache-capacity",
    "--fusion-threshold-mb", "--min-np", "--max-np", "--host-discovery-script",
}  # fmt: skip
# Options whose meaning the operator provides itself: dropped without a warning
# (horovodrun adds --allow-run-as-root for Open MPI itself).
_PROVIDED: Final = {
    "-np", "-n", "-c", "--np", "-H", "--host", "-host", "--hostfile", "-hostfile",
    "--machinefile", "-machinefile", "--allow-run-as-root", "-p", "--ssh-port",
    *GENERATED_HOROVODRUN_OPTIONS,
}  # fmt: skip
# MCA parameters horovodrun writes itself, and the values it writes (the same
# given again are dropped without a warning).
_HOROVODRUN_MCA_VALUES: Final = {"pml": ["pml", "ob1"], "btl": ["btl", "^openib"]}
# mpirun's process placement options: horovodrun's --binding-args.
_BINDING: Final = {"bind-to", "map-by", "rank-by"}
# horovodrun's elastic options: a HorovodJob runs a fixed size.
_ELASTIC: Final = {"--min-np", "--max-np", "--host-discovery-script"}


class ConvertError(ValueError):
    """The input is not an MPIJob this converter understands; the message says why."""


def _split_launch(argv: list[str]) -> tuple[list[str], list[str]]:
    """(launcher options, per-rank program) of an mpirun/horovodrun command line."""
    if not argv or argv[0].rsplit("/", 1)[-1] not in LAUNCHERS:
        return [], argv
    options: list[str] = []
    i = 1
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("-"):
            break
        options.append(arg)
        if arg in _WITH_VALUE and "=" not in arg:
            # -mca and --mca take a key and a value.
            takes = 2 if arg in ("-mca", "--mca", "-gmca", "--gmca") else 1
            options.extend(argv[i + 1 : i + 1 + takes])
            i += takes
        i += 1
    return options, argv[i:]


def _at(words: list[str], index: int) -> str:
    return words[index] if index < len(words) else ""


def _kept(options: list[str], warnings: list[str]) -> list[list[str]]:
    """The launcher options the operator does not write itself, each with its values."""
    kept: list[list[str]] = []
    i = 0
    while i < len(options):
        arg = options[i]
        takes = 0
        if arg in _WITH_VALUE and "=" not in arg:
            takes = 2 if arg in ("-mca", "--mca", "-gmca", "--gmca") else 1
        option = arg.split("=", 1)[0]
        if option in _ELASTIC:
            warnings.append(
                f"launcher option {' '.join(options[i : i + 1 + takes])!r} is dropped: "
                "elastic horovodrun options do not carry over"
            )
        elif (
            option in ("-mca", "--mca") and (param := _at(options, i + 1)) in HOROVODRUN_MCA_PARAMS
        ):
            if options[i + 1 : i + 3] != _HOROVODRUN_MCA_VALUES.get(param):
                warnings.append(
                    f"launcher option {' '.join(options[i : i + 1 + takes])!r} is dropped: "
                    f"horovodrun writes MCA parameter {param} itself and Open MPI refuses it "
                    "twice (spec.launcher.template's command can run mpirun directly)"
                )
        elif option not in _PROVIDED:
            kept.append(options[i : i + 1 + takes])
        i += 1 + takes
    return kept


def _horovodrun_args(launcher: str, kept: list[list[str]]) -> list[str]:
    """spec.launcher.horovodrunArgs for the options kept: horovodrun's own pass as
    they are; mpirun's go through horovodrun's --mpi-args, which it pastes into
    its mpirun command line (a shell line, hence the quoting)."""
    if launcher == "horovodrun":
        return [arg for option in kept for arg in option]
    # horovodrun writes its own -bind-to/-map-by unless given --binding-args, and
    # mpirun refuses an option given twice.
    binding = [o for o in kept if o[0].lstrip("-").split("=")[0] in _BINDING]
    other = [o for o in kept if o not in binding]
    args = []
    for flag, group in (("--binding-args", binding), ("--mpi-args", other)):
        if group:
            args.append(f"{flag}=" + " ".join(shlex.quote(a) for option in group for a in option))
    return args


def _container(template: Obj | None) -> Obj:
    containers = ((template or {}).get("spec") or {}).get("containers") or []
    return containers[0] if containers else {}


def convert(mpijob: Obj) -> tuple[Obj, list[str]]:
    """The HorovodJob for an MPIJob, and what did not carry over."""
    if mpijob.get("kind") != "MPIJob":
        raise ConvertError(f"kind is {mpijob.get('kind')!r}, not MPIJob")
    spec: Obj = mpijob.get("spec") or {}
    replicas: Obj = spec.get("mpiReplicaSpecs") or {}
    worker_spec: Obj = replicas.get("Worker") or {}
    launcher_spec: Obj = replicas.get("Launcher") or {}
    if not worker_spec:
        raise ConvertError(
            "spec.mpiReplicaSpecs.Worker is missing: a HorovodJob needs its workers "
            "(an MPIJob that runs only a launcher has nothing to convert)"
        )
    warnings: list[str] = []
    meta: Obj = mpijob.get("metadata") or {}
    out_meta: Obj = {"name": meta.get("name", "converted")}
    for key in ("namespace", "labels", "annotations"):
        if meta.get(key):
            out_meta[key] = copy.deepcopy(meta[key])

    worker_template = copy.deepcopy(worker_spec.get("template") or {})
    worker_container = _container(worker_template)
    launcher_container = _container(launcher_spec.get("template"))
    image = worker_container.get("image") or launcher_container.get("image") or ""
    if launcher_container.get("image") and launcher_container.get("image") != image:
        warnings.append(
            f"the launcher's image {launcher_container['image']!r} differs from the workers' "
            f"{image!r}: a HorovodJob runs both from spec.image (the workers')"
        )

    argv = [*launcher_container.get("command", []), *launcher_container.get("args", [])]
    options, program = _split_launch(argv)
    if not program:
        raise ConvertError(
            "the launcher's command has no program to run after its mpirun options: "
            "spec.mpiReplicaSpecs.Launcher.template.spec.containers[0].command/args"
        )
    launcher_name = argv[0].rsplit("/", 1)[-1] if options else ""
    horovodrun_args = _horovodrun_args(launcher_name, _kept(options, warnings))
    slots = int(spec.get("slotsPerWorker") or 1)
    worker_replicas = int(worker_spec.get("replicas") or 1)
    if "-np" in options or "-n" in options:
        flag = "-np" if "-np" in options else "-n"
        asked = options[options.index(flag) + 1]
        if asked.isdigit() and int(asked) != worker_replicas * slots:
            warnings.append(
                f"{flag} {asked} is not workers x slotsPerWorker ({worker_replicas} x {slots}): "
                f"the HorovodJob runs {worker_replicas * slots} ranks"
            )

    # Resources move to worker.resources; the rest of the template stays as it was.
    worker: Obj = {"replicas": worker_replicas}
    resources = worker_container.pop("resources", None)
    if resources:
        worker["resources"] = resources
    worker_container.pop("image", None)
    worker_container["name"] = names.WORKER_CONTAINER
    # The workers' command (their sshd, e.g. /usr/sbin/sshd -De) stays: with
    # spec.ssh.authMountPath the image runs its own sshd, as under mpi-operator.
    # Old examples wrote command: [""] for "the image's entrypoint".
    for key in ("command", "args"):
        if key in worker_container and not any(worker_container[key]):
            del worker_container[key]
    template_spec: Obj = worker_template.get("spec") or {}
    bare = worker_container == {"name": names.WORKER_CONTAINER}
    if template_spec.get("containers") and not (bare and set(template_spec) == {"containers"}):
        worker["template"] = worker_template
    gpus = (resources or {}).get("limits", {}).get(GPU_RESOURCE)
    if gpus is not None and slots > int(str(gpus)):
        warnings.append(f"slotsPerWorker {slots} is more than the {gpus} GPU(s) a worker asks for")

    out_spec: Obj = {"image": image, "command": program, "slotsPerWorker": slots, "worker": worker}
    launcher_template = copy.deepcopy(launcher_spec.get("template") or {})
    launcher_rest = {
        k: v for k, v in (launcher_template.get("spec") or {}).items() if k != "containers"
    }
    launcher_out: Obj = {}
    if launcher_container.get("env"):
        # horovodrun passes its environment on to every rank.
        launcher_rest["containers"] = [
            {"name": names.ROLE_LAUNCHER, "env": launcher_container["env"]}
        ]
    if launcher_rest:
        launcher_out["template"] = {"spec": launcher_rest}
        if launcher_template.get("metadata"):
            launcher_out["template"]["metadata"] = launcher_template["metadata"]
    if horovodrun_args:
        launcher_out["horovodrunArgs"] = horovodrun_args
    if launcher_out:
        out_spec["launcher"] = launcher_out

    run_policy = _run_policy(spec, warnings)
    if run_policy:
        out_spec["runPolicy"] = run_policy
    manager = (spec.get("runPolicy") or {}).get("managedBy")
    if manager and manager != MPI_OPERATOR_MANAGER:
        # MultiKueue's, say: the job stays its to dispatch, as the MPIJob was.
        out_spec["managedBy"] = manager
    scheduling = _scheduling(spec, warnings)
    if scheduling:
        out_spec["scheduling"] = scheduling
    # An image written for mpi-operator runs unchanged: its sshd, its ~/.ssh.
    out_spec["ssh"] = {"authMountPath": spec.get("sshAuthMountPath") or MPI_OPERATOR_SSH_PATH}
    warnings.append(
        "the workers run the image's own sshd with the keys at ssh.authMountPath, as under "
        "mpi-operator; for the horovod-worker image (non-root, host-key checked) remove "
        "spec.ssh and the workers' command (docs/migrating-from-mpijob.md)"
    )
    if spec.get("mpiImplementation") not in (None, "OpenMPI"):
        warnings.append(
            f"mpiImplementation {spec['mpiImplementation']!r}: the operator launches with "
            "Open MPI's horovodrun; Intel MPI and MPICH are not supported"
        )
    job = {"apiVersion": API_VERSION, "kind": KIND, "metadata": out_meta, "spec": out_spec}
    return job, warnings


def _run_policy(spec: Obj, warnings: list[str]) -> Obj:
    given: Obj = spec.get("runPolicy") or {}
    policy: Obj = {}
    for key in ("backoffLimit", "activeDeadlineSeconds", "ttlSecondsAfterFinished", "suspend"):
        if given.get(key) is not None:
            policy[key] = given[key]
    clean = given.get("cleanPodPolicy")
    if clean is not None:
        if clean in ("None", "Running", "All"):
            policy["cleanPodPolicy"] = clean
        else:
            warnings.append(f"cleanPodPolicy {clean!r} is unknown; the default (Running) applies")
    if spec.get("launcherCreationPolicy") in ("AtStartup", "WaitForWorkersReady"):
        policy["launcherCreationPolicy"] = spec["launcherCreationPolicy"]
    if given.get("managedBy") == MPI_OPERATOR_MANAGER:
        warnings.append(
            f"runPolicy.managedBy {MPI_OPERATOR_MANAGER!r} is dropped: this operator runs the job"
        )
    return policy


def _scheduling(spec: Obj, warnings: list[str]) -> Obj:
    given: Obj = (spec.get("runPolicy") or {}).get("schedulingPolicy") or {}
    scheduling: Obj = {}
    if given.get("queue"):
        scheduling["queue"] = given["queue"]
    if given.get("priorityClass"):
        scheduling["priorityClassName"] = given["priorityClass"]
    if given.get("minAvailable") is not None:
        # mpi-operator counts the launcher in minAvailable; our gang holds the workers.
        workers = max(1, int(given["minAvailable"]) - 1)
        scheduling["gang"] = {"policy": "Auto", "minAvailable": workers}
        warnings.append(
            f"schedulingPolicy.minAvailable {given['minAvailable']} counts the launcher; the "
            f"HorovodJob's gang.minAvailable counts workers: {workers}"
        )
    for key in ("minResources", "scheduleTimeoutSeconds"):
        if given.get(key) is not None:
            warnings.append(
                f"schedulingPolicy.{key} is dropped (the schedule timeout is "
                "runPolicy.startupTimeoutSeconds)"
            )
    return scheduling
