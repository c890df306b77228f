"""HorovodJobClient: create, read, wait for, follow and delete HorovodJobs from Python.

Built on the official `kubernetes` client and the operator's own models, so a
job the SDK sends is checked by the same pydantic rules the operator applies
(`api.parse_job`) before the API server sees it.

    from horovod_operator.sdk import HorovodJobClient
    jobs = HorovodJobClient(namespace="team-a")
    jobs.create(manifest)
    jobs.wait("digits", timeout=1800, progress=print)
    for rank, line in jobs.logs("digits", follow=True, rank=0):
        print(line)
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Final, cast

try:
    from kubernetes import client, config
    from kubernetes.client.exceptions import ApiException
except ImportError as missing:  # the operator image installs no SDK client
    raise ImportError(
        "horovod_operator.sdk and hvjob need the kubernetes package: "
        "pip install 'horovod-operator[sdk]'"
    ) from missing
from pydantic import ValidationError

from horovod_contract.rank_output import RankSplitter

from .. import names
from ..api import API_VERSION, GROUP, KIND, PLURAL, VERSION, format_validation_error, parse_job

Obj = dict[str, Any]
FINISHED: Final = ("Succeeded", "Failed")


class JobError(Exception):
    """A request about a job failed; the message says which job and why."""


class JobNotFound(JobError):
    pass


class WaitTimeout(JobError):
    pass


def summary(job: Mapping[str, Any]) -> str:
    """One line of a job's state: phase, workers ready, reason and message."""
    status = job.get("status") or {}
    workers = (status.get("workers") or {}).get("summary", "-")
    text = f"{job['metadata']['name']}: {status.get('phase', 'Pending')} (workers {workers})"
    if status.get("reason"):
        text += f" {status['reason']}"
    if status.get("message"):
        text += f": {status['message']}"
    training = progress_summary(status)
    if training and status.get("phase") == "Running":
        text += f"; {training}"
    return text


def progress_summary(status: Mapping[str, Any]) -> str | None:
    """The current attempt's training progress in words (status.progress), or None."""
    progress = status.get("progress") or {}
    if not progress or progress.get("attempt", 0) != status.get("restarts", 0):
        return None
    parts = []
    if progress.get("step") is not None:
        epoch = f" (epoch {progress['epoch']})" if progress.get("epoch") is not None else ""
        parts.append(f"step {progress['step']}{epoch}")
    if progress.get("samplesPerSecond") is not None:
        parts.append(f"{progress['samplesPerSecond']} samples/s")
    if progress.get("worldSize") is not None:
        parts.append(f"world size {progress['worldSize']}")
    if progress.get("lastProgressTime"):
        parts.append(f"last step at {progress['lastProgressTime']}")
    return ", ".join(parts) or None


def load_configuration(kubeconfig: str | None, context: str | None = None) -> client.Configuration:
    """A user's tools prefer their kubeconfig and fall back to in-cluster credentials
    (in a pod); a kubeconfig or context named explicitly is always used."""
    configuration = client.Configuration()
    try:
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=kubeconfig, context=context, client_configuration=configuration
        )
    except config.ConfigException:
        if kubeconfig is not None or context is not None:
            raise
        try:
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        except config.ConfigException:
            pass
        else:
            return configuration
        raise
    return configuration


class HorovodJobClient:
    """One namespace's HorovodJobs. `kubeconfig`/`context` pick the cluster; without
    them the usual kubeconfig, then in-cluster credentials."""

    def __init__(
        self,
        namespace: str = "default",
        kubeconfig: str | None = None,
        context: str | None = None,
        api_client: client.ApiClient | None = None,
    ) -> None:
        self.namespace = namespace
        if api_client is None:
            configuration = load_configuration(kubeconfig, context)
            api_client = client.ApiClient(configuration)
        self._custom = client.CustomObjectsApi(api_client)
        self._core = client.CoreV1Api(api_client)

    # --- jobs ------------------------------------------------------------------------

    def create(self, manifest: Mapping[str, Any]) -> Obj:
        """Create a job from a manifest (a dict as in YAML). Refused here, naming the
        field, when the operator's own rules refuse it."""
        body = dict(manifest)
        body.setdefault("apiVersion", API_VERSION)
        body.setdefault("kind", KIND)
        metadata = dict(body.get("metadata") or {})
        metadata.setdefault("namespace", self.namespace)
        body["metadata"] = metadata
        try:
            # The operator fills an empty image from its default: do not refuse that here.
            parse_job(body, default_image="operator-default")
        except ValidationError as error:
            raise JobError(
                f"HorovodJob {metadata.get('name')!r} is invalid: {format_validation_error(error)}"
            ) from None
        try:
            created = cast(
                Obj,
                self._custom.create_namespaced_custom_object(
                    GROUP, VERSION, metadata["namespace"], PLURAL, body
                ),
            )
        except ApiException as error:
            raise JobError(_api_message(error, f"creating {metadata.get('name')!r}")) from None
        return created

    def get(self, name: str) -> Obj:
        try:
            job = cast(
                Obj,
                self._custom.get_namespaced_custom_object(
                    GROUP, VERSION, self.namespace, PLURAL, name
                ),
            )
        except ApiException as error:
            if error.status == 404:
                raise JobNotFound(f"no HorovodJob {name!r} in namespace {self.namespace}") from None
            raise JobError(_api_message(error, f"reading {name!r}")) from None
        return job

    def list_jobs(self, label_selector: str = "") -> list[Obj]:
        try:
            listed = cast(
                Obj,
                self._custom.list_namespaced_custom_object(
                    GROUP, VERSION, self.namespace, PLURAL, label_selector=label_selector
                ),
            )
        except ApiException as error:
            raise JobError(_api_message(error, "listing jobs")) from None
        items: list[Obj] = listed.get("items", [])
        return sorted(items, key=lambda j: j["metadata"]["name"])

    def delete(self, name: str, wait: bool = False, timeout: float = 120) -> None:
        """Delete a job (its pods go with it: they are owned by it)."""
        try:
            self._custom.delete_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, name, propagation_policy="Foreground"
            )
        except ApiException as error:
            if error.status == 404:
                raise JobNotFound(f"no HorovodJob {name!r} in namespace {self.namespace}") from None
            raise JobError(_api_message(error, f"deleting {name!r}")) from None
        if wait:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                try:
                    self.get(name)
                except JobNotFound:
                    return
                time.sleep(1)
            raise WaitTimeout(f"HorovodJob {name!r} still exists {timeout:.0f}s after delete")

    def wait(
        self,
        name: str,
        phases: Iterable[str] = FINISHED,
        timeout: float = 3600,
        interval: float = 2,
        progress: Callable[[str], None] | None = None,
    ) -> Obj:
        """Poll until the job's phase is one of `phases`; the job then. `progress` gets
        a one-line summary each time it changes (the CLI prints them)."""
        wanted = set(phases)
        deadline = time.monotonic() + timeout
        last = ""
        while True:
            job = self.get(name)
            line = summary(job)
            if progress is not None and line != last:
                progress(line)
            last = line
            if (job.get("status") or {}).get("phase") in wanted:
                return job
            if time.monotonic() >= deadline:
                raise WaitTimeout(
                    f"HorovodJob {name!r} not {'/'.join(sorted(wanted))} after {timeout:.0f}s: "
                    f"{line}"
                )
            time.sleep(interval)

    def create_configmap(self, configmap: Mapping[str, Any]) -> Obj:
        """Create a ConfigMap beside the jobs (`hvjob submit`'s script)."""
        try:
            # The client takes a plain dict as well as a V1ConfigMap.
            created = self._core.create_namespaced_config_map(
                self.namespace, cast(Any, dict(configmap))
            )
        except ApiException as error:
            name = configmap["metadata"]["name"]
            raise JobError(_api_message(error, f"creating ConfigMap {name!r}")) from None
        result: Obj = self._core.api_client.sanitize_for_serialization(created)
        return result

    # --- what happened ---------------------------------------------------------------

    def launcher_pod(self, name: str) -> Obj | None:
        """The newest launcher pod of the job (None before there is one)."""
        selector = f"{names.LABEL_JOB_NAME}={name},{names.LABEL_ROLE}={names.ROLE_LAUNCHER}"
        pods = self._core.list_namespaced_pod(self.namespace, label_selector=selector)
        items = [self._core.api_client.sanitize_for_serialization(p) for p in pods.items]
        if not items:
            return None
        newest: Obj = max(items, key=lambda p: p["metadata"].get("creationTimestamp") or "")
        return newest

    def logs(
        self, name: str, follow: bool = False, rank: int | None = None, wait_for_pod: float = 300
    ) -> Iterator[tuple[int | None, str]]:
        """(rank, line) of the launcher's output, horovodrun's rank tags taken off;
        with `rank`, only that rank's lines. `follow` streams until the launcher ends."""
        deadline = time.monotonic() + wait_for_pod
        pod = self.launcher_pod(name)
        while pod is None or (pod.get("status") or {}).get("phase") == "Pending":
            if time.monotonic() >= deadline:
                raise WaitTimeout(f"HorovodJob {name!r} has no running launcher pod yet")
            time.sleep(1)
            pod = self.launcher_pod(name)
        pod_name = pod["metadata"]["name"]
        splitter = RankSplitter()
        try:
            if follow:
                # Without preloading the client returns the urllib3 response, to stream.
                stream = cast(
                    Any,
                    self._core.read_namespaced_pod_log(
                        pod_name, self.namespace, follow=True, _preload_content=False
                    ),
                )
                for chunk in stream.stream(decode_content=True):
                    text = chunk.decode(errors="replace") if isinstance(chunk, bytes) else chunk
                    yield from _only(splitter.feed(text), rank)
            else:
                text = self._core.read_namespaced_pod_log(pod_name, self.namespace)
                yield from _only(splitter.feed(text), rank)
        except ApiException as error:
            raise JobError(_api_message(error, f"reading the log of {pod_name}")) from None
        yield from _only(splitter.flush(), rank)

    def events(self, name: str) -> list[Obj]:
        """Events about the job itself, oldest first."""
        found = self._core.list_namespaced_event(
            self.namespace,
            field_selector=f"involvedObject.kind={KIND},involvedObject.name={name}",
        )
        events = [self._core.api_client.sanitize_for_serialization(e) for e in found.items]
        return sorted(events, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")


def _only(
    lines: list[tuple[int | None, str]], rank: int | None
) -> Iterator[tuple[int | None, str]]:
    return (line for line in lines if rank is None or line[0] == rank)


def _api_message(error: ApiException, doing: str) -> str:
    try:
        message = json.loads(error.body or "{}").get("message") or error.reason
    except ValueError:
        message = error.reason
    return f"{doing}: {error.status} {message}"
