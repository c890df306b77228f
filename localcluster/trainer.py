"""Kubeflow Trainer v2 and JobSet as local processes, with their webhooks.

The benchmark's second peer (docs/benchmarks/trainer-v2.md): a TrainJob runs on
a JobSet, so two controller-runtime managers run, each built by gobuild from
hack/tools/{trainer,jobset}/go.mod. Both are meant to run in pods behind
Services; here, as for Kueue (kueue.py), what the in-cluster install provides
is made by hand:

- the CRDs, from the modules' own manifests (server-side applied);
- each Configuration, from its manifest defaults with what a process needs: no
  leader election, local ports, built-in certificate rotation off (there is no
  Secret for it to rotate into, nor a kubelet to mount one);
- one serving certificate for both webhook servers, signed by the cluster's CA:
  JobSet reads it from its configured certDir, Trainer from controller-runtime's
  default, `$TMPDIR/k8s-webhook-server/serving-certs`, so it gets its own TMPDIR;
- the modules' Validating/MutatingWebhookConfigurations, each pointed at
  `https://127.0.0.1:<port>/<path>` with the CA bundle. JobSet's defaulting
  webhook is not optional: its controller reads fields only the webhook sets.
  Its pod webhooks keep the objectSelector its kustomization adds, so they see
  JobSet's pods only.
"""

from __future__ import annotations

import base64
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

import yaml

from . import crds, gobuild
from .pki import serving_cert
from .poll import wait_for
from .processes import ManagedProcess, free_port, http_ok
from .webhooks import apply_webhooks, delete_webhooks

TRAINER_MODULE: Final = gobuild.TRAINER_MODULE
JOBSET_MODULE: Final = "sigs.k8s.io/jobset"
# Our names for their webhook configurations: never the names a real install uses.
WEBHOOK_PREFIX: Final = "local-"
# JobSet's kustomization narrows its pod webhooks to JobSet's own pods.
_JOBSET_PODS: Final = {
    "matchExpressions": [{"key": "jobset.sigs.k8s.io/jobset-name", "operator": "Exists"}]
}
_POD_WEBHOOKS: Final = frozenset({"mpod.kb.io", "vpod.kb.io"})
# Starts of the two managers when a port chosen for them was taken before they bound it.
PORT_ATTEMPTS: Final = 3

Kubectl = Callable[..., "subprocess.CompletedProcess[str]"]


class TrainerError(RuntimeError):
    """Trainer or JobSet could not be installed or started; the message says why."""


def _root(tool: str, module: str) -> Path:
    try:
        return gobuild.module_source(module, gobuild.tool(tool).version())
    except gobuild.BuildError as error:
        raise TrainerError(str(error)) from error


def trainer_root() -> Path:
    return _root("trainer", TRAINER_MODULE)


def jobset_root() -> Path:
    return _root("jobset", JOBSET_MODULE)


def crd_files() -> list[Path]:
    trainer = sorted((trainer_root() / "manifests/base/crds").glob("trainer.kubeflow.org_*.yaml"))
    jobset = jobset_root() / "config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml"
    return [*trainer, jobset]


def jobset_configuration(
    health_port: int, webhook_port: int, cert_dir: Path, qps: float, burst: int
) -> dict[str, Any]:
    return {
        "apiVersion": "config.jobset.x-k8s.io/v1alpha1",
        "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"port": webhook_port, "host": "127.0.0.1", "certDir": str(cert_dir)},
        "clientConnection": {"qps": qps, "burst": burst},
    }


def trainer_configuration(
    health_port: int, webhook_port: int, qps: float, burst: int
) -> dict[str, Any]:
    """The module's configuration with local ports, no leader election and no
    certificate rotation; the rest (controller concurrency) as shipped."""
    template = trainer_root() / "manifests/base/manager/controller_manager_config.yaml"
    config: dict[str, Any] = yaml.safe_load(template.read_text())
    config["health"] = {
        "healthProbeBindAddress": f"127.0.0.1:{health_port}",
        "readinessEndpointName": "readyz",
        "livenessEndpointName": "healthz",
    }
    config["metrics"] = {"bindAddress": "0"}
    config["webhook"] = {"port": webhook_port, "host": "127.0.0.1"}
    config["leaderElection"] = {"leaderElect": False}
    config["certManagement"] = {"enable": False}
    config["clientConnection"] = {"qps": qps, "burst": burst}
    return config


def local_webhooks(
    owner: str, manifests: Path, port: int, ca_bundle: bytes
) -> list[dict[str, Any]]:
    """A module's webhook configurations, renamed and pointed at the local process.
    Both modules name theirs kubebuilder's defaults ("mutating-webhook-configuration"),
    which their kustomizations prefix: the owner goes into the name, or Trainer's
    would replace JobSet's (and JobSet's defaulting, restartPolicy among it, is lost)."""
    docs = [d for d in yaml.safe_load_all(manifests.read_text()) if d]
    bundle = base64.b64encode(ca_bundle).decode()
    for doc in docs:
        doc["metadata"] = {"name": f"{WEBHOOK_PREFIX}{owner}-{doc['metadata']['name']}"}
        for hook in doc.get("webhooks") or ():
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": bundle}
            if hook["name"] in _POD_WEBHOOKS:
                hook["objectSelector"] = _JOBSET_PODS
    return docs


class _Manager(ManagedProcess):
    """One controller-runtime manager process: its argv, environment and /readyz."""

    error = TrainerError

    def __init__(self, name: str, log_path: Path) -> None:
        super().__init__(log_path)
        self.name = name
        self.choose_ports()

    def choose_ports(self) -> None:
        """Two ports free now; taken right before the launch, since anything on the
        machine may bind a port between the choice and the manager's own bind
        (Horovod's services pick theirs at random from 1024-65535)."""
        self.health_port = free_port()
        self.webhook_port = free_port()

    def start(self, argv: Sequence[str], env: dict[str, str]) -> None:
        self.launch(list(argv), env=env)

    def ready(self) -> bool:
        self.check_running()
        return http_ok(f"http://127.0.0.1:{self.health_port}/readyz", timeout=1)


class TrainerProcess:
    """JobSet's and Trainer's controller managers against one cluster, and their webhooks."""

    def __init__(
        self,
        kubeconfig: Path,
        kubectl: Kubectl,
        pki: Path,
        state: Path,
        log_path: Path,
        qps: float = 50.0,
        burst: int = 100,
    ) -> None:
        self.kubeconfig = kubeconfig
        self.kubectl = kubectl
        self.pki = pki
        self.state = state
        self.log_path = log_path
        self.qps, self.burst = qps, burst
        self.jobset = _Manager("jobset", log_path.with_suffix(".jobset.log"))
        self.trainer = _Manager("trainer", log_path)
        self.webhooks: list[dict[str, Any]] = []
        self.label = "Kubeflow Trainer v2"

    @property
    def pids(self) -> list[int]:
        """Both managers: a TrainJob's work is done by the two together."""
        return [m.proc.pid for m in (self.trainer, self.jobset) if m.proc is not None]

    @property
    def pid(self) -> int:
        return self.pids[0]

    def install_crds(self, timeout: float = 120) -> None:
        files = crd_files()
        names = [yaml.safe_load(f.read_text())["metadata"]["name"] for f in files]
        args = [a for f in files for a in ("-f", str(f))]
        self.kubectl("apply", "--server-side", "--force-conflicts", *args, timeout=timeout)
        crds.wait_established(self.kubectl, names, timeout)

    def start_and_wait(self, timeout: float = 120) -> float:
        """Build (cached), install the CRDs, start both managers, install their webhooks
        and wait until the API server calls them. Returns the seconds it took."""
        started = time.monotonic()
        binaries = {
            "trainer": gobuild.ensure("trainer-controller-manager"),
            "jobset": gobuild.ensure("jobset-controller"),
        }
        self.state.mkdir(parents=True, exist_ok=True)
        self.install_crds()
        tmp = self.state / "tmp"
        certs = tmp / "k8s-webhook-server" / "serving-certs"
        serving_cert(
            certs, "tls", "trainer-webhook", "IP:127.0.0.1,DNS:localhost",
            ca=(self.pki / "ca.crt", self.pki / "ca.key"),
        )  # fmt: skip
        env = {
            "KUBECONFIG": str(self.kubeconfig),
            "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
            "TMPDIR": str(tmp),
        }
        for attempt in range(1, PORT_ATTEMPTS + 1):
            try:
                self._start_managers(env, certs, binaries, started, timeout)
                break
            except TrainerError as error:
                for manager in (self.trainer, self.jobset):
                    manager.stop()
                if "address already in use" not in str(error) or attempt == PORT_ATTEMPTS:
                    raise
                print(
                    f"[trainer] {self.label}: a port chosen for it was taken before it bound"
                    " it; starting again on new ports",
                    file=sys.stderr,
                    flush=True,
                )
        self.install_webhooks()
        return time.monotonic() - started

    def _start_managers(
        self,
        env: dict[str, str],
        certs: Path,
        binaries: dict[str, Path],
        started: float,
        timeout: float,
    ) -> None:
        for manager in (self.jobset, self.trainer):
            manager.choose_ports()
        jobset_config = self.state / "jobset-config.yaml"
        jobset_config.write_text(
            yaml.safe_dump(
                jobset_configuration(
                    self.jobset.health_port, self.jobset.webhook_port, certs, self.qps, self.burst
                )
            )
        )
        trainer_config = self.state / "trainer-config.yaml"
        trainer_config.write_text(
            yaml.safe_dump(
                trainer_configuration(
                    self.trainer.health_port, self.trainer.webhook_port, self.qps, self.burst
                )
            )
        )
        self.jobset.start([str(binaries["jobset"]), f"--config={jobset_config}"], env)
        self.trainer.start([str(binaries["trainer"]), f"--config={trainer_config}"], env)
        for manager in (self.jobset, self.trainer):
            wait_for(
                manager.ready,
                max(1.0, started + timeout - time.monotonic()),
                interval=0.5,
                message=f"{manager.name} ready (/readyz)",
                describe=self._describe,
                error=TrainerError,
            )

    def install_webhooks(self) -> None:
        ca = (self.pki / "ca.crt").read_bytes()
        self.webhooks = [
            *local_webhooks(
                "jobset",
                jobset_root() / "config/components/webhook/manifests.yaml",
                self.jobset.webhook_port,
                ca,
            ),
            *local_webhooks(
                "trainer",
                trainer_root() / "manifests/base/webhook/manifests.yaml",
                self.trainer.webhook_port,
                ca,
            ),
        ]
        apply_webhooks(self.kubectl, self.webhooks)

    def remove_webhooks(self) -> None:
        """Before the process goes (webhooks.delete_webhooks)."""
        delete_webhooks(self.kubectl, self.webhooks)
        self.webhooks = []

    def stop(self, timeout: float = 20) -> None:
        self.remove_webhooks()
        for manager in (self.trainer, self.jobset):
            manager.stop(timeout)

    def tail(self, lines: int = 60) -> str:
        return self.trainer.tail(lines)

    def _describe(self) -> str:
        return "\n".join(
            f"--- {m.name} log ({m.log_path}) ---\n{m.tail(40)}"
            for m in (self.jobset, self.trainer)
        )
