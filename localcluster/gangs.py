"""Volcano's and scheduler-plugins' PodGroups on the local control plane.

- Their CRDs, as the modules ship them: `volcano.sh/volcano` (VOLCANO_VERSION,
  config/crd/volcano/bases) and `sigs.k8s.io/scheduler-plugins` (the version
  hack/tools/scheduler-plugins/go.mod pins, manifests/coscheduling/crd.yaml),
  downloaded into the Go module cache with `go mod download`.
- scheduler-plugins' kube-scheduler with the Coscheduling plugin as a second
  scheduler process (profile `scheduler-plugins-scheduler`, the name the
  project's own Helm chart gives it), built by gobuild. It talks to the API
  server as admin: the coscheduling plugin lists and watches PodGroups, which
  the system:kube-scheduler role does not allow.

- Volcano's scheduler (vc-scheduler, built by gobuild) with all of Volcano's
  CRDs (its caches wait for every kind it watches) and its `default` Queue,
  Open. Volcano's controller manager and webhooks are not run: the scheduler
  alone places a PodGroup's pods and writes its status; what the controller
  would do for a Queue (its state) is written here.
"""

from __future__ import annotations

import ssl
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import yaml

from . import crds, gobuild
from .poll import wait_for
from .processes import ManagedProcess, free_port, http_ok

VOLCANO_MODULE: Final = "volcano.sh/volcano"
VOLCANO_VERSION: Final = "v1.14.1"
SCHEDULER_PLUGINS_MODULE: Final = "sigs.k8s.io/scheduler-plugins"
SCHEDULER_NAME: Final = "scheduler-plugins-scheduler"
# Kubernetes 1.35 turns NominatedNodeNameForExpectation on (beta): a pod waiting
# at Permit is nominated to its node, and the nomination outlives Coscheduling's
# rejection of the group. Two gangs that contend at once then each keep one
# nominated node and wait on each other forever (seen here: v0.35.4-devel, two
# jobs of 2 x 8 GPUs on two 8-GPU nodes, neither bound after 90s). Off, the
# rejected group frees its nodes and the other gang is placed (docs/scheduling.md).
FEATURE_GATES: Final = "NominatedNodeNameForExpectation=false"
# How long a member that fits waits at Permit for the rest of its group when the
# PodGroup says nothing (scheduleTimeoutSeconds); upstream's sample config uses 10.
PERMIT_WAITING_SECONDS: Final = 10

Kubectl = Callable[..., "subprocess.CompletedProcess[str]"]


class GangError(RuntimeError):
    """A CRD could not be fetched or the scheduler not started; the message says why."""


def module_root(module: str, version: str) -> Path:
    """A module's sources in the Go module cache, downloaded when missing."""
    try:
        return gobuild.module_source(module, version)
    except gobuild.BuildError as error:
        raise GangError(str(error)) from error


def scheduler_plugins_version() -> str:
    return gobuild.tool("scheduler-plugins").version()


def volcano_crd() -> Path:
    root = module_root(VOLCANO_MODULE, VOLCANO_VERSION)
    return root / "config/crd/volcano/bases/scheduling.volcano.sh_podgroups.yaml"


def coscheduling_crd() -> Path:
    root = module_root(SCHEDULER_PLUGINS_MODULE, scheduler_plugins_version())
    return root / "manifests/coscheduling/crd.yaml"


def crd_name(path: Path) -> str:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    crds = [d for d in docs if d.get("kind") == "CustomResourceDefinition"]
    if len(crds) != 1:
        raise GangError(f"{path}: expected one CustomResourceDefinition, found {len(crds)}")
    return str(crds[0]["metadata"]["name"])


def install_crds(kubectl: Kubectl, paths: list[Path], timeout: float = 60) -> list[str]:
    """Apply CRD files and wait until each is Established (crds.py); their names."""
    names = [crd_name(path) for path in paths]
    args = [a for path in paths for a in ("-f", str(path))]
    kubectl("apply", "--server-side", "--force-conflicts", *args, timeout=timeout)
    crds.wait_established(kubectl, names, timeout, error=GangError)
    return names


def install_crd(kubectl: Kubectl, path: Path, timeout: float = 60) -> str:
    """Apply a CRD file and wait until it is Established; its name."""
    return install_crds(kubectl, [path], timeout)[0]


def uninstall_crd(kubectl: Kubectl, path: Path, timeout: float = 60) -> None:
    """Delete a CRD (and its objects), waiting until the API server no longer has it."""
    name = crd_name(path)
    kubectl("delete", "crd", name, "--ignore-not-found", f"--timeout={int(timeout)}s", check=False)


def volcano_crds() -> list[Path]:
    root = module_root(VOLCANO_MODULE, VOLCANO_VERSION)
    return sorted((root / "config/crd/volcano/bases").glob("*.yaml"))


def volcano_queue(kubectl: Kubectl, name: str, weight: int = 1) -> None:
    """A Volcano Queue, Open (the state Volcano's queue controller would set)."""
    queue = {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "Queue",
        "metadata": {"name": name},
        "spec": {"weight": weight, "reclaimable": True},
    }
    kubectl("apply", "-f", "-", input=yaml.safe_dump(queue))
    kubectl(
        "patch", "queue.scheduling.volcano.sh", name, "--subresource=status", "--type=merge",
        "-p", '{"status":{"state":"Open"}}',
    )  # fmt: skip


# Volcano's default scheduler configuration (its Helm chart's), gang first.
VOLCANO_CONF: Final = """\
actions: "enqueue, allocate, backfill"
tiers:
- plugins:
  - name: priority
  - name: gang
    enablePreemptable: false
  - name: conformance
- plugins:
  - name: drf
    enablePreemptable: false
  - name: predicates
  - name: proportion
  - name: nodeorder
  - name: binpack
"""


class VolcanoScheduler(ManagedProcess):
    """vc-scheduler against one cluster, with Volcano's CRDs and default Queue."""

    name = "Volcano's scheduler (vc-scheduler)"
    error = GangError

    def __init__(self, kubeconfig: Path, kubectl: Kubectl, state: Path, log_path: Path) -> None:
        super().__init__(log_path)
        self.kubeconfig = kubeconfig
        self.kubectl = kubectl
        self.state = state
        self.port = free_port()
        self.healthz_port = free_port()

    def install(self) -> None:
        install_crds(self.kubectl, volcano_crds())
        volcano_queue(self.kubectl, "default")

    def uninstall(self) -> None:
        for path in volcano_crds():
            uninstall_crd(self.kubectl, path)

    def start(self, timeout: float = 60) -> float:
        """Install the CRDs and default Queue, start vc-scheduler and wait until it
        serves /healthz; the seconds it took."""
        started = time.monotonic()
        self.install()
        self.state.mkdir(parents=True, exist_ok=True)
        conf = self.state / "volcano-scheduler.conf"
        conf.write_text(VOLCANO_CONF)
        argv = [
            str(gobuild.ensure("vc-scheduler")),
            f"--kubeconfig={self.kubeconfig}",
            f"--scheduler-conf={conf}",
            "--leader-elect=false",
            f"--listen-address=127.0.0.1:{self.port}",
            "--enable-healthz",
            f"--healthz-address=127.0.0.1:{self.healthz_port}",
            "--v=3",
        ]
        self.launch(argv)
        wait_for(
            self._ready,
            timeout,
            interval=0.5,
            message="Volcano's scheduler serving /healthz",
            describe=lambda: f"--- its log ({self.log_path}) ---\n{self.tail()}",
            error=GangError,
        )
        return time.monotonic() - started

    def _ready(self) -> bool:
        self.check_running()
        return http_ok(f"http://127.0.0.1:{self.healthz_port}/healthz")


def scheduler_configuration(kubeconfig: Path, permit_seconds: int = PERMIT_WAITING_SECONDS) -> Any:
    """A KubeSchedulerConfiguration of one profile: the default plugins plus
    Coscheduling, whose queue sort replaces the default one (upstream's
    manifests/coscheduling/scheduler-config.yaml, renamed to a second scheduler)."""
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "leaderElection": {"leaderElect": False},
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "profiles": [
            {
                "schedulerName": SCHEDULER_NAME,
                "plugins": {
                    "multiPoint": {"enabled": [{"name": "Coscheduling"}]},
                    "queueSort": {
                        "enabled": [{"name": "Coscheduling"}],
                        "disabled": [{"name": "*"}],
                    },
                },
                "pluginConfig": [
                    {
                        "name": "Coscheduling",
                        "args": {"permitWaitingTimeSeconds": permit_seconds},
                    }
                ],
            }
        ],
    }


class CoschedulingScheduler(ManagedProcess):
    """scheduler-plugins' kube-scheduler with Coscheduling, against one cluster."""

    name = "the coscheduling scheduler"
    error = GangError

    def __init__(
        self, kubeconfig: Path, state: Path, log_path: Path, feature_gates: str = FEATURE_GATES
    ) -> None:
        super().__init__(log_path)
        self.kubeconfig = kubeconfig
        self.feature_gates = feature_gates
        self.state = state
        self.port = free_port()

    def argv(self, config: Path) -> list[str]:
        binary = gobuild.ensure("kube-scheduler-plugins")
        return [
            str(binary),
            f"--config={config}",
            f"--authentication-kubeconfig={self.kubeconfig}",
            f"--authorization-kubeconfig={self.kubeconfig}",
            # The control plane has no front-proxy CA to look up (log noise only).
            "--authentication-skip-lookup=true",
            "--bind-address=127.0.0.1",
            f"--secure-port={self.port}",
            *([f"--feature-gates={self.feature_gates}"] if self.feature_gates else []),
            "--v=2",
        ]

    def start(self, timeout: float = 60) -> float:
        """Start it and wait until it serves /healthz; the seconds it took."""
        started = time.monotonic()
        self.state.mkdir(parents=True, exist_ok=True)
        config = self.state / "scheduler-config.yaml"
        config.write_text(yaml.safe_dump(scheduler_configuration(self.kubeconfig)))
        self.launch(self.argv(config))
        wait_for(
            self._ready,
            timeout,
            interval=0.5,
            message="the coscheduling scheduler serving /healthz",
            describe=lambda: f"--- its log ({self.log_path}) ---\n{self.tail()}",
            error=GangError,
        )
        return time.monotonic() - started

    def _ready(self) -> bool:
        self.check_running()
        # Its serving certificate is self-signed: only liveness is asked here.
        unverified = ssl.create_default_context()
        unverified.check_hostname = False
        unverified.verify_mode = ssl.CERT_NONE
        return http_ok(f"https://127.0.0.1:{self.port}/healthz", context=unverified)
