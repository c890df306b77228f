"""Watches one namespace and records when each pod and job state was first seen.

Times are this process's monotonic clock at the moment a watch event arrived;
the harness reads the same clock just before it creates a job, so every
latency is "create request sent" to "state visible to a client".
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from localcluster.kube import Client

from . import manifests

Obj = dict[str, Any]


class Tracker:
    def __init__(
        self, client: Client, namespace: str, jobs_path: str, phase_of: Callable[[Obj], str | None]
    ) -> None:
        self.client = client
        self.namespace = namespace
        self.jobs_path = jobs_path
        self.phase_of = phase_of
        self.cond = threading.Condition()
        self.pod_seen: dict[str, float] = {}
        self.pod_phase: dict[str, dict[str, float]] = defaultdict(dict)
        self.workers: dict[str, set[str]] = defaultdict(set)
        self.launchers: dict[str, set[str]] = defaultdict(set)
        self.job_phase: dict[str, dict[str, float]] = defaultdict(dict)
        self.pod_gone: set[str] = set()
        self._stop = threading.Event()

    def start(self) -> Tracker:
        ns = self.namespace
        self.client.watch_in_thread(f"/api/v1/namespaces/{ns}/pods", self._on_pod, self._stop)
        self.client.watch_in_thread(self.jobs_path, self._on_job, self._stop)
        return self

    def stop(self) -> None:
        self._stop.set()

    def _on_pod(self, event: Obj) -> None:
        now = time.monotonic()
        pod = event["object"]
        name = pod["metadata"]["name"]
        if event.get("type") == "DELETED":
            with self.cond:
                self.pod_gone.add(name)
                self.cond.notify_all()
            return
        role = manifests.pod_role(name)
        phase = (pod.get("status") or {}).get("phase") or "Pending"
        with self.cond:
            self.pod_seen.setdefault(name, now)
            self.pod_phase[name].setdefault(phase, now)
            if role is not None:
                (self.workers if role[1] == "worker" else self.launchers)[role[0]].add(name)
            self.cond.notify_all()

    def _on_job(self, event: Obj) -> None:
        now = time.monotonic()
        if event.get("type") == "DELETED":
            return
        obj = event["object"]
        phase = self.phase_of(obj)
        if phase is None:
            return
        with self.cond:
            self.job_phase[obj["metadata"]["name"]].setdefault(phase, now)
            self.cond.notify_all()

    # --- waiting and reading (call with or without the lock; reads copy under it) ---------

    def wait(self, predicate: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        with self.cond:
            while not predicate():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
                self.cond.wait(min(left, 1.0))

    def all_pods(self, job: str, workers: int) -> bool:
        return len(self.workers.get(job, ())) >= workers and bool(self.launchers.get(job))

    def workers_gone(self, job: str) -> bool:
        return all(p in self.pod_gone for p in self.workers.get(job, ()))

    def pods_created_at(self, job: str) -> tuple[float, float]:
        """(last worker seen, last of workers and launcher pod seen)."""
        with self.cond:
            w = max(self.pod_seen[p] for p in self.workers[job])
            launcher = min(self.pod_seen[p] for p in self.launchers[job])
        return w, max(w, launcher)

    def phase_at(self, job: str, phase: str) -> float | None:
        with self.cond:
            return self.job_phase.get(job, {}).get(phase)

    def launcher_pod(self, job: str) -> str:
        with self.cond:
            return sorted(self.launchers[job], key=lambda p: self.pod_seen[p])[0]

    def pod_phase_at(self, pod: str, phase: str) -> float | None:
        with self.cond:
            return self.pod_phase.get(pod, {}).get(phase)
