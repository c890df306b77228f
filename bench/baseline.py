"""The physical limit: a minimal client that creates what a HorovodJob needs, at once.

For each HorovodJob that appears in its namespace it creates the same objects the
operator creates (the Secret, ConfigMap, Service, N worker pods and the launcher
Job, from the operator's own pure builders), all at once, through the same client
and rate limiter (QPS/burst) as the operator, with no reconcile logic: no status
first, no gang stage, no waiting for Ready workers, no indexes. What the bench
measures for it (create -> all pods exist) is what the API server allows at that
client rate; at an unlimited rate, what it allows at all on this machine.

With --ordered it keeps the one rule both operators keep: the launcher Job is
created once every worker pod is Ready (mpi-operator's WaitForWorkersReady; ours
always), seen from a pod watch, and nothing else. Its create -> all pods is the
limit for a launcher that does not race its workers: the scheduler's bindings and
the node's Ready at their own client rates, which no operator can beat.

    python -m bench.baseline --kubeconfig K --namespace NS --qps 50 --burst 100 [--ordered]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import threading
from pathlib import Path
from typing import Any

from horovod_operator import builders, names
from horovod_operator.api import GROUP, PLURAL, VERSION, parse_job
from horovod_operator.kube import Kube
from horovod_operator.kube_errors import KubeError
from horovod_operator.sshkeys import generate_key_pair
from localcluster.kube import Client

READY_LINE = "baseline client ready"
UNLIMITED = 1e9
logger = logging.getLogger("baseline")


def children(body: dict[str, Any]) -> list[dict[str, Any]]:
    """Everything the operator would create for the job's first attempt."""
    job = parse_job(body)
    keys, host_key = generate_key_pair(), generate_key_pair("horovod-job-host")
    objs = [
        builders.new_ssh_secret(job, keys, host_key),
        builders.new_config_map(job),
        builders.new_worker_service(job),
        *(builders.new_worker_pod(job, i, 0) for i in range(job.spec.worker.replicas)),
        builders.new_launcher_job(job, 0),
    ]
    for obj in objs:
        obj["metadata"].setdefault("namespace", job.metadata.namespace)
    return objs


async def create_all(kube: Kube, objs: list[dict[str, Any]]) -> int:
    """Create every object concurrently; the number refused."""
    results = await asyncio.gather(*(kube.create(o) for o in objs), return_exceptions=True)
    refused = [r for r in results if isinstance(r, KubeError)]
    for error in refused[:3]:
        logger.warning("refused: %s", error)
    return len(refused)


class LauncherGate:
    """--ordered: each job's launcher Job, held until every one of its workers is Ready."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.held: dict[str, tuple[int, dict[str, Any]]] = {}  # job -> (workers, launcher)
        self.ready: dict[str, set[str]] = {}  # job -> its Ready worker pods

    def hold(self, job: str, workers: int, launcher: dict[str, Any]) -> dict[str, Any] | None:
        """Hold `launcher` for `job`; it back at once when its workers are all Ready already."""
        with self.lock:
            self.held[job] = (workers, launcher)
            return self._release(job)

    def on_pod(self, pod: dict[str, Any], deleted: bool = False) -> dict[str, Any] | None:
        """A pod's watch event; the launcher to create now, if this made a job's last
        worker Ready."""
        labels = pod["metadata"].get("labels") or {}
        if labels.get(names.LABEL_ROLE) != names.ROLE_WORKER:
            return None
        job = labels.get(names.LABEL_JOB_NAME, "")
        with self.lock:
            ready = self.ready.setdefault(job, set())
            if pod_ready(pod) and not deleted:
                ready.add(pod["metadata"]["name"])
            else:
                ready.discard(pod["metadata"]["name"])
            return self._release(job)

    def _release(self, job: str) -> dict[str, Any] | None:
        held = self.held.get(job)
        if held is None or len(self.ready.get(job, ())) < held[0]:
            return None
        del self.held[job]
        self.ready.pop(job, None)
        return held[1]


def pod_ready(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or ()
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--qps", type=float, default=50.0, help="0: unlimited")
    parser.add_argument("--burst", type=int, default=100)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument(
        "--ordered", action="store_true", help="the launcher Job once every worker is Ready"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    # "Unlimited": a bucket that never runs dry (inf would make 0 x inf a NaN).
    qps, burst = (args.qps, args.burst) if args.qps > 0 else (UNLIMITED, int(UNLIMITED))
    kube = Kube.from_kubeconfig(args.kubeconfig, qps=qps, burst=burst, connections=args.connections)
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()

    watcher = Client(Path(args.kubeconfig))
    seen: set[str] = set()
    stop = threading.Event()
    gate = LauncherGate() if args.ordered else None

    def create(objs: list[dict[str, Any]], what: str) -> None:
        refused = asyncio.run_coroutine_threadsafe(create_all(kube, objs), loop).result()
        logger.info("%s: %d objects created, %d refused", what, len(objs) - refused, refused)

    if gate is not None:

        def on_pod(event: dict[str, Any]) -> None:
            launcher = gate.on_pod(event["object"], deleted=event["type"] == "DELETED")
            if launcher is not None:
                create([launcher], f"{launcher['metadata']['name']} (workers Ready)")

        pods = Client(Path(args.kubeconfig))
        pods.watch_in_thread(f"/api/v1/namespaces/{args.namespace}/pods", on_pod, stop)
    print(READY_LINE, file=sys.stderr, flush=True)
    for event in watcher.stream(
        f"/apis/{GROUP}/{VERSION}/namespaces/{args.namespace}/{PLURAL}", stop
    ):
        body = event["object"]
        uid = body["metadata"]["uid"]
        if event["type"] != "ADDED" or uid in seen:
            continue
        seen.add(uid)
        objs = children(body)
        name = body["metadata"]["name"]
        if gate is None:
            create(objs, name)
            continue
        *first, launcher = objs
        create(first, name)
        workers = sum(1 for o in first if o["kind"] == "Pod")
        if (released := gate.hold(name, workers, launcher)) is not None:
            create([released], f"{name} launcher (workers Ready)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
