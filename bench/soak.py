"""Chaos soak: many jobs, seeded faults, invariants checked all the time.

    .venv/bin/python -m bench.soak                      # 10 minutes, ~300 jobs (make soak)
    .venv/bin/python -m bench.soak --minutes 1.5 --jobs 20 --seed 7   # the CI variant

Starts its own control plane (localcluster, kwok nodes) and two operator
replicas with leader election, then for `--minutes` submits jobs, finishes
their launchers, and injects one fault every few seconds, chosen by a seeded
random generator: deleting and evicting worker pods, failing launchers and
workers with chosen exit codes, SIGKILLing the leader and the standby,
restarting the API server, flipping a ResourceQuota, deleting whole jobs.

A checker reads the namespace every second and records a violation when:
- two launcher pods of one job run at once (Pending or Running, not terminating);
- an object with the operator's labels has no controller, or a HorovodJob
  controller that never existed;
- a job's counted restarts (restarts - uncountedRestarts) exceed its backoffLimit;
- a job older than a minute has no status.reason (it waits silently).
At the end the faults stop, every remaining job is driven to its end, and the
checker requires every job to be Succeeded or Failed with a reason and nothing
of a deleted job to be left. The report (JSON and Markdown) counts faults by
kind, checks made and violations; the seed reproduces the run.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from localcluster.cluster import SIM_EXIT_CODE, SIM_PHASE, SIM_REASON
from localcluster.kube import ApiError, Client
from localcluster.namespaces import create_namespace
from localcluster.paths import REPO

from . import control_plane
from .procs import OperatorSpec, log, operator_process

NS = "soak"
LEASE = "soak-operator"
MANAGED = "app.kubernetes.io/managed-by=horovod-operator"
HVJOBS = f"/apis/horovod.ai/v1alpha1/namespaces/{NS}/horovodjobs"
PODS = f"/api/v1/namespaces/{NS}/pods"
GC_GRACE = 90.0  # seconds garbage collection may take to remove a deleted job's objects
SILENT_GRACE = 60.0  # seconds a job may exist without status.reason (operators restarting)
Obj = dict[str, Any]


def _items(client: Client, path: str) -> list[Obj]:
    data = client.get(path)
    return list((data or {}).get("items") or [])


def _controller(obj: Obj) -> Obj | None:
    for ref in obj["metadata"].get("ownerReferences") or ():
        if ref.get("controller"):
            return dict(ref)
    return None


def _labels(obj: Obj) -> dict[str, str]:
    return dict(obj["metadata"].get("labels") or {})


def _alive(pod: Obj) -> bool:
    phase = (pod.get("status") or {}).get("phase") or "Pending"
    return phase in ("Pending", "Running") and not pod["metadata"].get("deletionTimestamp")


class Soak:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        # The faults (kind, pick, pause) come from one generator, the jobs from
        # another, so the fault schedule depends on the seed alone; which pod a
        # pick lands on still depends on what runs at that moment.
        self.rng = random.Random(args.seed)
        self.job_rng = random.Random(args.seed * 7919 + 1)
        self.stop = threading.Event()
        self.faults: Counter[str] = Counter()
        self.checks = 0
        self.violations: list[str] = []
        self.violation_keys: set[str] = set()
        self.seen_uids: dict[str, float] = {}  # HorovodJob uid -> when last seen (monotonic)
        self.deleted: dict[str, float] = {}  # uid -> when we deleted the job
        self.submitted = 0
        self.pick = 0.0
        self.exit_code = 1
        self.lock = threading.Lock()
        self.out = Path(args.out)
        self.logs = Path(args.dir).resolve().parent / "soak-logs"  # never into docs/

    # --- set-up ----------------------------------------------------------------------------

    def up(self) -> None:
        self.cluster = control_plane.fresh(self.args.dir, self.args.port_base)
        layout = self.cluster.layout
        self.kubeconfig = layout.kubeconfig
        # One client per thread: bench.kube.Client keeps one connection.
        self.client = Client(layout.kubeconfig, user_agent="horovod-soak")
        self.checker = Client(layout.kubeconfig, user_agent="horovod-soak-checker")
        self.finisher = Client(layout.kubeconfig, user_agent="horovod-soak-finisher")
        control_plane.install_horovod_crd(self.cluster)
        create_namespace(self.client, NS)
        spec = OperatorSpec(
            key="ours",
            label="horovod-operator",
            kind="horovod",
            qps=50,
            burst=100,
            extra=[
                "--leader-elect",
                "--leader-election-namespace",
                NS,
                "--leader-election-id",
                LEASE,
                "--stuck-pod-grace",
                "5",
            ],
        )
        self.logs.mkdir(parents=True, exist_ok=True)
        self.operators = [
            operator_process(spec, layout.kubeconfig, [NS], self.logs / f"operator-{i}.log")
            for i in range(2)
        ]
        for op in self.operators:
            op.start_and_wait()

    def down(self) -> None:
        """Stop what up() started, also when it stopped half-way (a refused CRD)."""
        for op in getattr(self, "operators", []):
            op.stop()
        for name in ("client", "checker", "finisher"):
            client = getattr(self, name, None)
            if client is not None:
                client.close()
        cluster = getattr(self, "cluster", None)
        if cluster is not None and not self.args.keep:
            cluster.down(quiet=True)

    # --- load ------------------------------------------------------------------------------

    def submit(self, index: int) -> None:
        workers = self.job_rng.randint(1, 4)
        job = {
            "apiVersion": "horovod.ai/v1alpha1",
            "kind": "HorovodJob",
            "metadata": {"name": f"soak-{index}"},
            "spec": {
                "image": "example.org/horovod-worker:0.1",
                "command": ["python", "train.py"],
                "worker": {"replicas": workers, "resources": {"limits": {"nvidia.com/gpu": 1}}},
                "runPolicy": {
                    "backoffLimit": self.job_rng.choice([0, 1, 2]),
                    "startupTimeoutSeconds": 120,
                    "ttlSecondsAfterFinished": self.job_rng.choice([5, 30, 3600]),
                },
            },
        }
        created = self.client.create(HVJOBS, job)
        # Known from the moment it exists: the operator can make its children between
        # the checker's list of jobs and its lists of children, and a child whose job
        # the checker has not listed yet is not an unknown job's.
        uid = (created.get("metadata") or {}).get("uid")
        if uid:
            self.seen_uids[uid] = time.monotonic()
        self.submitted += 1

    def finish_launchers(self, older_than: float) -> None:
        """Launchers that ran long enough succeed (kwok finishes them on annotation)."""
        now = dt.datetime.now(dt.UTC)
        for pod in _items(self.finisher, f"{PODS}?labelSelector=horovod.ai/role=launcher"):
            if not _alive(pod) or (pod.get("status") or {}).get("phase") != "Running":
                continue
            started = pod["metadata"].get("creationTimestamp")
            age = (now - dt.datetime.fromisoformat(started.replace("Z", "+00:00"))).total_seconds()
            if age >= older_than:
                self._set_phase(pod, "Succeeded", client=self.finisher)

    def _set_phase(
        self,
        pod: Obj,
        phase: str,
        exit_code: int = 0,
        reason: str = "",
        client: Client | None = None,
    ) -> None:
        annotations = {
            SIM_PHASE: phase,
            SIM_EXIT_CODE: str(exit_code),
        }
        if reason:
            annotations[SIM_REASON] = reason
        self.finisher.merge_patch(
            f"{PODS}/{pod['metadata']['name']}", {"metadata": {"annotations": annotations}}
        )

    # --- faults ----------------------------------------------------------------------------

    def _running_pods(self, role: str) -> list[Obj]:
        pods = _items(self.client, f"{PODS}?labelSelector=horovod.ai/role={role}")
        return [p for p in pods if _alive(p) and (p.get("status") or {}).get("phase") == "Running"]

    def inject(self) -> None:
        kinds: list[tuple[str, Callable[[], bool]]] = [
            ("delete-worker", self._delete_worker),
            ("evict-worker", self._evict_worker),
            ("fail-worker", self._fail_worker),
            ("fail-launcher", self._fail_launcher),
            ("kill-leader", lambda: self._kill_operator(leader=True)),
            ("kill-standby", lambda: self._kill_operator(leader=False)),
            ("restart-apiserver", self._restart_apiserver),
            ("flip-quota", self._flip_quota),
            ("delete-job", self._delete_job),
        ]
        weights = [5, 4, 4, 4, 1, 1, 1, 2, 2]
        name, fault = self.rng.choices(kinds, weights)[0]
        self.pick = self.rng.random()
        self.exit_code = self.rng.choice([1, 2, 137, 143])
        if fault():
            self.faults[name] += 1
            log(f"fault: {name}")

    def _pick(self, items: list[Obj]) -> Obj | None:
        ordered = sorted(items, key=lambda o: o["metadata"]["name"])
        return ordered[int(self.pick * len(ordered))] if ordered else None

    def _delete_worker(self) -> bool:
        pod = self._pick(self._running_pods("worker"))
        if pod is None:
            return False
        self.client.delete(f"{PODS}/{pod['metadata']['name']}")
        return True

    def _evict_worker(self) -> bool:
        pod = self._pick(self._running_pods("worker"))
        if pod is None:
            return False
        name = pod["metadata"]["name"]
        eviction = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": NS},
        }
        self.client.create(f"{PODS}/{name}/eviction", eviction)
        return True

    def _fail_worker(self) -> bool:
        pod = self._pick(self._running_pods("worker"))
        if pod is None:
            return False
        self._set_phase(pod, "Failed", 137, "OOMKilled")
        return True

    def _fail_launcher(self) -> bool:
        pod = self._pick(self._running_pods("launcher"))
        if pod is None:
            return False
        self._set_phase(pod, "Failed", self.exit_code)
        return True

    def _kill_operator(self, leader: bool) -> bool:
        lease = self.client.get(f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/{LEASE}")
        holder = ((lease or {}).get("spec") or {}).get("holderIdentity") or ""
        for op in self.operators:
            is_leader = f"-{op.pid}-" in holder
            if is_leader == leader and op.proc is not None and op.proc.poll() is None:
                op.kill()
                op.start_and_wait()  # a new process, as a Deployment's pod would be
                return True
        return False

    def _restart_apiserver(self) -> bool:
        self.cluster.restart("kube-apiserver")
        return True

    def _flip_quota(self) -> bool:
        path = f"/api/v1/namespaces/{NS}/resourcequotas"
        if self.client.get(f"{path}/soak-quota"):
            self.client.delete(f"{path}/soak-quota")
        else:
            quota = {"metadata": {"name": "soak-quota"}, "spec": {"hard": {"pods": "6"}}}
            self.client.create(path, quota)
        return True

    def _delete_job(self) -> bool:
        jobs = _items(self.client, HVJOBS)
        job = self._pick(jobs)
        if job is None:
            return False
        with self.lock:
            self.deleted[job["metadata"]["uid"]] = time.monotonic()
        self.client.delete(f"{HVJOBS}/{job['metadata']['name']}")
        return True

    # --- invariants ------------------------------------------------------------------------

    def violate(self, key: str, text: str) -> None:
        """Record a violation once per key (the same problem seen on every check)."""
        with self.lock:
            if key not in self.violation_keys:
                self.violation_keys.add(key)
                self.violations.append(text)
                log(f"VIOLATION: {text}")

    def check(self, final: bool = False) -> None:
        jobs = _items(self.checker, HVJOBS)
        now = time.monotonic()
        current = {}
        for job in jobs:
            uid = job["metadata"]["uid"]
            current[uid] = job
            self.seen_uids[uid] = now
        pods = _items(self.checker, f"{PODS}?labelSelector={MANAGED}")
        others: list[Obj] = []
        for kind, path in (
            ("Job", f"/apis/batch/v1/namespaces/{NS}/jobs"),
            ("Secret", f"/api/v1/namespaces/{NS}/secrets"),
            ("ConfigMap", f"/api/v1/namespaces/{NS}/configmaps"),
            ("Service", f"/api/v1/namespaces/{NS}/services"),
        ):
            for item in _items(self.checker, f"{path}?labelSelector={MANAGED}"):
                item["kind"] = kind
                others.append(item)
        self.checks += 1

        launchers: Counter[str] = Counter()
        for pod in pods:
            if _labels(pod).get("horovod.ai/role") == "launcher" and _alive(pod):
                launchers[_labels(pod).get("horovod.ai/job-uid", "?")] += 1
        for uid, count in launchers.items():
            if count > 1:
                self.violate(
                    f"launchers {uid}", f"{count} launcher pods run at once, job uid {uid}"
                )

        for obj in [*pods, *others]:
            name = f"{obj.get('kind', 'Pod')} {obj['metadata']['name']}"
            controller = _controller(obj)
            if controller is None:
                self.violate(f"orphan {name}", f"{name} has the operator's labels, no controller")
                continue
            if controller.get("kind") != "HorovodJob":
                continue  # launcher pods: their Job's, checked through the Job
            uid = controller.get("uid", "")
            if uid not in self.seen_uids:
                self.violate(f"unknown {name}", f"{name} is controlled by an unknown job {uid}")
            elif uid not in current and (final or now - self.seen_uids[uid] > GC_GRACE):
                self.violate(f"leftover {name}", f"{name} outlived its deleted job (uid {uid})")

        for job in jobs:
            status = job.get("status") or {}
            policy = job["spec"].get("runPolicy") or {}
            counted = int(status.get("restarts") or 0) - int(status.get("uncountedRestarts") or 0)
            name = job["metadata"]["name"]
            if counted > int(policy.get("backoffLimit", 3)):
                self.violate(
                    f"backoff {name}",
                    f"{name}: {counted} counted restarts, backoffLimit {policy['backoffLimit']}",
                )
            created = dt.datetime.fromisoformat(
                job["metadata"]["creationTimestamp"].replace("Z", "+00:00")
            )
            age = (dt.datetime.now(dt.UTC) - created).total_seconds()
            if not status.get("reason") and age > SILENT_GRACE:
                self.violate(
                    f"silent {name}",
                    f"{name}: no status.reason {SILENT_GRACE:.0f}s after its creation",
                )
            if final and status.get("phase") not in ("Succeeded", "Failed"):
                self.violate(
                    f"end {name}",
                    f"{name}: still {status.get('phase')} ({status.get('reason')}) at the end",
                )

    def _loop(self, every: float, fn: Callable[[], None]) -> threading.Thread:
        def run() -> None:
            while not self.stop.wait(every):
                try:
                    fn()
                except (ApiError, OSError, subprocess.SubprocessError, RuntimeError) as error:
                    log(f"{fn.__name__}: {error}")  # the API server may be restarting

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    # --- the run ---------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        args = self.args
        started = time.monotonic()
        total = args.minutes * 60
        checker = self._loop(1.0, self.check)
        finisher = self._loop(2.0, lambda: self.finish_launchers(older_than=8))
        next_job = 0
        while time.monotonic() - started < total:
            elapsed = time.monotonic() - started
            try:
                while next_job < args.jobs and next_job <= elapsed / total * args.jobs:
                    self.submit(next_job)
                    next_job += 1
                if elapsed > 10:
                    self.inject()
            except (ApiError, OSError, subprocess.SubprocessError, RuntimeError) as error:
                log(f"load: {error}")
            time.sleep(self.rng.uniform(1.0, 4.0))
        log("faults stop; driving every job to its end")
        with self.lock:
            quota = self.client.get(f"/api/v1/namespaces/{NS}/resourcequotas/soak-quota")
        if quota:
            self.client.delete(f"/api/v1/namespaces/{NS}/resourcequotas/soak-quota")
        drain_deadline = time.monotonic() + args.drain_seconds
        while time.monotonic() < drain_deadline:
            jobs = _items(self.client, HVJOBS)
            if all((j.get("status") or {}).get("phase") in ("Succeeded", "Failed") for j in jobs):
                break
            time.sleep(2)
        self.stop.set()
        checker.join(timeout=30)
        finisher.join(timeout=30)
        # Let garbage collection finish for what was deleted, then check once more.
        settle = time.monotonic() + min(GC_GRACE, 60)
        while time.monotonic() < settle:
            try:
                self.check_leftovers_only()
                break
            except AssertionError:
                time.sleep(2)
        self.check(final=True)
        jobs = _items(self.client, HVJOBS)
        phases = Counter((j.get("status") or {}).get("phase") for j in jobs)
        reasons = Counter(
            (j.get("status") or {}).get("reason")
            for j in jobs
            if (j.get("status") or {}).get("phase") == "Failed"
        )
        return {
            "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "commit": _commit(),
            "seed": args.seed,
            "minutes": args.minutes,
            "jobs_submitted": self.submitted,
            "jobs_left_by_phase": dict(phases),
            "failed_by_reason": dict(reasons),
            "jobs_deleted_by_the_soak": len(self.deleted),
            "faults": dict(sorted(self.faults.items())),
            "faults_total": sum(self.faults.values()),
            "invariant_checks": self.checks,
            "violations": self.violations,
            "duration_s": round(time.monotonic() - started, 1),
            "loadavg": os.getloadavg(),
        }

    def check_leftovers_only(self) -> None:
        live = {j["metadata"]["uid"] for j in _items(self.checker, HVJOBS)}
        for pod in _items(self.checker, f"{PODS}?labelSelector={MANAGED}"):
            controller = _controller(pod) or {}
            if controller.get("kind") == "HorovodJob" and controller.get("uid") not in live:
                raise AssertionError(pod["metadata"]["name"])


def _commit() -> str:
    proc = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    )
    return proc.stdout.strip() or "unknown"


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "# Chaos soak",
        "",
        f"Run {report['date']} at commit {report['commit']}, seed {report['seed']}, "
        f"{report['minutes']} minutes ({report['duration_s']} s with the drain), "
        f"load average {', '.join(f'{x:.2f}' for x in report['loadavg'])}. "
        "Reproduce with `python -m bench.soak --seed "
        f"{report['seed']} --minutes {report['minutes']}`.",
        "",
        f"- Jobs submitted: {report['jobs_submitted']}; deleted by the soak: "
        f"{report['jobs_deleted_by_the_soak']}; left at the end by phase: "
        f"{report['jobs_left_by_phase']} (the others were deleted by their TTL); "
        f"failed by reason: {report.get('failed_by_reason', {})}",
        f"- Faults injected: {report['faults_total']}",
        f"- Invariant checks (each a full read of the namespace): {report['invariant_checks']}",
        f"- Violations: {len(report['violations'])}",
        "",
        "| Fault | Count |",
        "| --- | --- |",
        *(f"| {name} | {count} |" for name, count in report["faults"].items()),
        "",
    ]
    if report["violations"]:
        lines += ["## Violations", "", *(f"- {v}" for v in report["violations"]), ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.soak", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--jobs", type=int, default=300, help="jobs submitted over the run")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--drain-seconds", type=float, default=240.0)
    parser.add_argument("--dir", default=str(REPO / ".work" / "soak-cluster"))
    parser.add_argument("--port-base", type=int, default=18300)
    parser.add_argument("--out", default=str(REPO / ".work" / "soak"))
    parser.add_argument("--keep", action="store_true", help="leave the cluster running")
    args = parser.parse_args(argv)
    soak = Soak(args)
    try:
        # Inside: a set-up that fails after the cluster started must stop it too (a
        # soak run left its control plane on the test ports of the next).
        soak.up()
        report = soak.run()
    finally:
        soak.down()
    soak.out.mkdir(parents=True, exist_ok=True)
    (soak.out / "soak.json").write_text(json.dumps(report, indent=2) + "\n")
    (soak.out / "README.md").write_text(markdown(report))
    print(markdown(report))
    return 1 if report["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
