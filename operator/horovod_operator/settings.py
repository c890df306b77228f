"""Operator options: command-line flags, each with an environment variable default."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from .claims import DEFAULT_GPU_DEVICE_CLASSES

ENV_PREFIX: Final = "HOROVOD_OPERATOR_"


@dataclass(frozen=True)
class OperatorConfig:
    namespaces: tuple[str, ...] = ()  # empty: all namespaces
    kubeconfig: str | None = None
    log_level: str = "INFO"
    log_format: str = "plain"  # plain | full | json
    http_port: int = 8080  # /healthz, /readyz, /metrics; 0 disables
    qps: float = 50.0
    burst: int = 100
    api_connections: int = 16  # API requests in flight at once
    batch_window: float = 0.05
    default_image: str | None = None  # for HorovodJobs that leave spec.image empty
    stuck_pod_grace: float = 60.0  # seconds past a pod's grace period before a force delete
    leader_elect: bool = False
    leader_election_namespace: str = "default"
    leader_election_id: str = "horovod-operator"
    stall_seconds: float = 180.0  # /healthz fails when a reconcile runs longer
    restrict_templates: bool = False  # refuse templates that gain privileges
    first_step_metric: bool = True  # read rank 0's log for the time to the first step
    # DRA DeviceClasses whose devices are GPUs (claims.py).
    gpu_device_classes: tuple[str, ...] = DEFAULT_GPU_DEVICE_CLASSES

    @property
    def all_namespaces(self) -> bool:
        return not self.namespaces


def _env(name: str, default: str) -> str:
    return os.environ.get(ENV_PREFIX + name, default)


def parse(argv: Sequence[str] | None = None) -> OperatorConfig:
    defaults = OperatorConfig()
    parser = argparse.ArgumentParser(
        prog="horovod-operator",
        description="Run the HorovodJob operator. Every flag also reads "
        f"{ENV_PREFIX}<FLAG> from the environment (e.g. {ENV_PREFIX}NAMESPACES=a,b).",
    )
    parser.add_argument(
        "-n",
        "--namespace",
        action="append",
        dest="namespaces",
        help="watch this namespace (repeatable; comma-separated lists work too); "
        "default: all namespaces",
    )
    parser.add_argument(
        "-A", "--all-namespaces", action="store_true", help="watch every namespace (default)"
    )
    parser.add_argument(
        "--kubeconfig",
        default=os.environ.get("KUBECONFIG") or None,
        help="kubeconfig path; default: in-cluster credentials, else ~/.kube/config",
    )
    parser.add_argument("--log-level", default=_env("LOG_LEVEL", defaults.log_level))
    parser.add_argument(
        "--log-format",
        choices=["plain", "full", "json"],
        default=_env("LOG_FORMAT", defaults.log_format),
    )
    parser.add_argument(
        "--http-port",
        type=int,
        default=int(_env("HTTP_PORT", str(defaults.http_port))),
        help="port of /healthz, /readyz and /metrics (0 disables)",
    )
    # Each of two buckets: the children's requests, and the HorovodJobs' own (kube.py).
    parser.add_argument("--qps", type=float, default=float(_env("QPS", str(defaults.qps))))
    parser.add_argument("--burst", type=int, default=int(_env("BURST", str(defaults.burst))))
    parser.add_argument(
        # --api-threads: its name while the requests ran in a thread pool each.
        "--api-connections",
        "--api-threads",
        type=int,
        default=int(_env("API_CONNECTIONS", str(defaults.api_connections))),
        help="API requests in flight at once",
    )
    parser.add_argument(
        "--batch-window",
        type=float,
        default=float(_env("BATCH_WINDOW", str(defaults.batch_window))),
        help="at most one reconcile of a job per this many seconds: the events that "
        "arrive meanwhile are folded into one (fewer status writes)",
    )
    parser.add_argument(
        "--default-image",
        default=_env("DEFAULT_IMAGE", "") or None,
        help="worker image for HorovodJobs that leave spec.image empty",
    )
    parser.add_argument(
        "--stuck-pod-grace",
        type=float,
        default=float(_env("STUCK_POD_GRACE", str(defaults.stuck_pod_grace))),
        help="seconds a pod may stay terminating past its grace period (its node lost) "
        "before the operator deletes it with grace period 0",
    )
    parser.add_argument(
        "--leader-elect",
        action=argparse.BooleanOptionalAction,
        default=_env("LEADER_ELECT", "false").lower() in ("1", "true", "yes"),
        help="run several replicas: only the holder of a coordination.k8s.io Lease acts",
    )
    parser.add_argument(
        "--leader-election-namespace",
        default=_env("LEADER_ELECTION_NAMESPACE", "")
        or os.environ.get("POD_NAMESPACE")
        or defaults.leader_election_namespace,
        help="namespace of the Lease (default: $POD_NAMESPACE, else default)",
    )
    parser.add_argument(
        "--leader-election-id",
        default=_env("LEADER_ELECTION_ID", defaults.leader_election_id),
        help="name of the Lease; replicas of one deployment share it",
    )
    parser.add_argument(
        "--stall-seconds",
        type=float,
        default=float(_env("STALL_SECONDS", str(defaults.stall_seconds))),
        help="/healthz fails when one reconcile has run this long (a hung API call)",
    )
    parser.add_argument(
        "--restrict-templates",
        action=argparse.BooleanOptionalAction,
        default=_env("RESTRICT_TEMPLATES", "false").lower() in ("1", "true", "yes"),
        help="refuse pod templates that name another ServiceAccount, mount another job's "
        "Secret, run privileged or in host namespaces, ask for a hostPort or nodeName, or use "
        "a volume type outside an allow-list (InvalidSpec naming the rule)",
    )
    parser.add_argument(
        "--first-step-metric",
        action=argparse.BooleanOptionalAction,
        default=_env("FIRST_STEP_METRIC", "true").lower() in ("1", "true", "yes"),
        help="read the start of rank 0's log for the time to the first training step "
        "(needs get on pods/log; off: no pod log is read)",
    )
    parser.add_argument(
        "--gpu-device-classes",
        default=_env("GPU_DEVICE_CLASSES", ",".join(defaults.gpu_device_classes)),
        help="comma-separated DRA DeviceClasses whose devices count as GPUs in a worker's "
        "ResourceClaimTemplates (slots check, HVJOB_GPUS_PER_WORKER) [%(default)s]",
    )
    args = parser.parse_args(argv)

    raw = args.namespaces or [_env("NAMESPACES", "")]
    namespaces = tuple(n.strip() for item in raw for n in item.split(",") if n.strip())
    if args.all_namespaces or namespaces == ("*",):
        namespaces = ()
    return OperatorConfig(
        namespaces=namespaces,
        kubeconfig=args.kubeconfig,
        log_level=args.log_level.upper(),
        log_format=args.log_format,
        http_port=args.http_port,
        qps=args.qps,
        burst=args.burst,
        api_connections=args.api_connections,
        batch_window=args.batch_window,
        default_image=args.default_image,
        stuck_pod_grace=args.stuck_pod_grace,
        leader_elect=args.leader_elect,
        leader_election_namespace=args.leader_election_namespace,
        leader_election_id=args.leader_election_id,
        stall_seconds=args.stall_seconds,
        restrict_templates=args.restrict_templates,
        first_step_metric=args.first_step_metric,
        gpu_device_classes=tuple(
            c.strip() for c in args.gpu_device_classes.split(",") if c.strip()
        ),
    )
