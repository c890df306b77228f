"""The operator as a test sees it: a subprocess watching one namespace, and kubectl
shortcuts for the jobs in it. The fixtures are in fixtures.py.

Waiting is always on an observable state (`Operator.wait`); a check that something
does *not* happen (`Operator.stays`) polls for a bounded time after a state that
proves the operator has acted, and fails at the first sight of the wrong effect.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from localcluster.operator import OperatorProcess
from localcluster.poll import holds, wait_for
from tests.support.cluster import KubeCluster

T = TypeVar("T")
CHILD_KINDS = ("pods", "jobs.batch", "secrets", "configmaps", "services")
NO_CHILDREN: dict[str, list[str]] = {kind: [] for kind in CHILD_KINDS}


class Operator(OperatorProcess):
    """The operator as a subprocess watching the test's namespace, with what tests
    ask of it: waits that show its log on failure, bounded checks, request counts."""

    def __init__(self, cluster: KubeCluster, namespace: str, log_path: Path) -> None:
        # A short batch window: tests wait on every status write.
        super().__init__(cluster.kubeconfig, [namespace], log_path, ["--batch-window", "0.05"])
        self.cluster = cluster
        self.namespace = namespace

    def log_tail(self, lines: int = 60) -> str:
        return self.tail(lines)

    def wait(
        self, fn: Callable[[], T | None], timeout: float = 30, message: str = "condition"
    ) -> T:
        """poll.wait_for, with the operator's log tail in the failure."""
        return wait_for(fn, timeout, message=message, describe=self._log_section)

    def stays(self, fn: Callable[[], object], seconds: float = 2.0, message: str = "") -> None:
        """Fail as soon as `fn()` is falsy within `seconds` (a bounded check that a
        wrong effect does not follow a state the test already waited for)."""
        holds(fn, seconds, message=message or "condition", describe=self._log_section)

    def requests(self, verb: str, kind: str) -> int:
        """API requests of the operator by verb and kind, from /metrics."""
        total = 0
        for line in self.metrics().splitlines():
            if line.startswith("horovod_operator_api_requests_total{") and (
                f'verb="{verb}"' in line and f'kind="{kind}"' in line
            ):
                total += int(float(line.rsplit(" ", 1)[1]))
        return total

    def pod_deletes(self) -> int:
        """Requests that delete pods: one by one, or several in one collection delete."""
        return self.requests("DELETE", "Pod") + self.requests("DELETECOLLECTION", "Pod")

    def _log_section(self) -> str:
        return f"--- operator log ---\n{self.log_tail()}"


class Jobs:
    """kubectl shortcuts for one namespace."""

    def __init__(self, cluster: KubeCluster, namespace: str, op: Operator) -> None:
        self.cluster = cluster
        self.ns = namespace
        self.op = op

    def apply(self, manifest: dict[str, Any]) -> None:
        self.cluster.kubectl("apply", "-n", self.ns, "-f", "-", input=json.dumps(manifest))

    def get(self, name: str) -> dict[str, Any] | None:
        read = self.cluster.reads.get("hvjob", name, self.ns)
        if read is not None:
            job: dict[str, Any] | None = read[1]
            return job
        proc = self.cluster.kubectl("get", "hvjob", name, "-n", self.ns, "-o", "json", check=False)
        return json.loads(proc.stdout) if proc.returncode == 0 else None

    def existing(self, name: str) -> dict[str, Any]:
        """The job, which must exist."""
        job = self.get(name)
        assert job is not None, f"no HorovodJob {name} in {self.ns}"
        return job

    def status(self, name: str) -> dict[str, Any]:
        job = self.get(name)
        return (job or {}).get("status") or {}

    def objects(self, kind: str, selector: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.cluster.get(kind, namespace=self.ns, selector=selector)[
            "items"
        ]
        return items

    def pods(self, name: str, role: str = "worker") -> list[dict[str, Any]]:
        return self.objects("pods", f"horovod.ai/job-name={name},horovod.ai/role={role}")

    def ready_workers(self, name: str) -> list[str]:
        return sorted(
            p["metadata"]["name"]
            for p in self.pods(name)
            if not p["metadata"].get("deletionTimestamp")
            and any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in p.get("status", {}).get("conditions", [])
            )
        )

    def launcher_pod(self, name: str) -> str | None:
        pods = [
            p for p in self.pods(name, "launcher") if not p["metadata"].get("deletionTimestamp")
        ]
        return pods[0]["metadata"]["name"] if pods else None

    def wait_phase(self, name: str, phase: str, timeout: float = 30) -> dict[str, Any]:
        def reached() -> dict[str, Any] | None:
            status = self.status(name)
            return status if status.get("phase") == phase else None

        return self.op.wait(
            reached,
            timeout,
            f"{name} phase {phase} (status: {self.status(name)})",
        )

    def wait_running(self, name: str, timeout: float = 40) -> str:
        """Until the launcher pod runs; returns its name."""
        self.wait_phase(name, "Running", timeout)
        launcher = self.op.wait(lambda: self.launcher_pod(name), 10, "launcher pod")
        return launcher

    def uid(self, name: str) -> str:
        return str(self.existing(name)["metadata"]["uid"])

    def condition(self, name: str, type_: str) -> dict[str, Any] | None:
        """The condition `type_` of the job when it is True."""
        for found in self.status(name).get("conditions", []):
            if found["type"] == type_ and found["status"] == "True":
                result: dict[str, Any] = found
                return result
        return None

    def warnings(self, name: str, uid: str | None = None) -> list[tuple[str, str]]:
        """(reason, message) of the Warning Events of the job (of one UID, if given)."""
        return [
            (e["reason"], e["message"])
            for e in self.events(name)
            if e["type"] == "Warning" and (uid is None or e["involvedObject"].get("uid") == uid)
        ]

    def events(self, name: str) -> list[dict[str, Any]]:
        out = self.cluster.kubectl(
            "get",
            "events",
            "-n",
            self.ns,
            "--field-selector",
            f"involvedObject.name={name},involvedObject.kind=HorovodJob",
            "-o",
            "json",
        ).stdout
        items: list[dict[str, Any]] = json.loads(out)["items"]
        return items

    def children(self, name: str) -> dict[str, list[str]]:
        """Names of every object of the job, by kind (pods and launcher Jobs by label)."""
        result = {}
        for kind in CHILD_KINDS:
            items = self.objects(kind, f"horovod.ai/job-name={name}")
            result[kind] = sorted(
                i["metadata"]["name"] for i in items if not i["metadata"].get("deletionTimestamp")
            )
        return result


def hvjob(name: str, replicas: int = 2, **spec: Any) -> dict[str, Any]:
    run_policy = spec.pop("runPolicy", {})
    worker = spec.pop("worker", {})
    return {
        "apiVersion": "horovod.ai/v1alpha1",
        "kind": "HorovodJob",
        "metadata": {"name": name},
        "spec": {
            "image": "horovod-worker:0.1.0",
            "command": ["python", "-m", "horovod_worker.train", "--epochs=1"],
            "worker": {
                "replicas": replicas,
                "resources": {"limits": {"nvidia.com/gpu": 1}},
                **worker,
            },
            "runPolicy": {"backoffLimit": 1, **run_policy},
            **spec,
        },
    }


def hand_labelled_worker(
    name: str, job: str, labels: dict[str, str] | None = None
) -> dict[str, Any]:
    """A bare pod someone made with a job's worker labels (and `labels`), owned by
    no job: the operator must neither count it nor delete it."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {
                "horovod.ai/job-name": job,
                "horovod.ai/role": "worker",
                "app.kubernetes.io/managed-by": "horovod-operator",
                **(labels or {}),
            },
        },
        "spec": {"containers": [{"name": "c", "image": "x"}]},
    }


def condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next(c for c in status.get("conditions", []) if c["type"] == type_)
