"""Kueue as a process against the local control plane, with its webhooks.

Kueue v0.17 is a controller-runtime manager meant to run in a pod behind a
Service. Here it runs as a local process (built by gobuild from
hack/tools/kueue/go.mod), and everything the in-cluster install provides is
made by hand:

- its CRDs, from the module's `config/components/crd/bases` (server-side
  applied: the Workload CRD is too large for the last-applied annotation);
- its Configuration, from the module's own template with what a process needs:
  no leader election, local ports, `internalCertManagement.enable: false`
  (there is no Service for it to rotate certs into) and the HorovodJob as an
  external framework;
- a serving certificate for its webhook server, signed by the cluster's CA;
- its Validating/MutatingWebhookConfigurations, from the module's
  `config/components/webhook/manifests.yaml` with the namespaceSelectors its
  kustomization adds, each rewritten to `url: https://127.0.0.1:<port>/<path>`
  with the CA bundle, so the API server calls the process.

Two paths are fixed in Kueue's main: the metrics server's certificate under
/etc/kueue/metrics/certs, and the visibility server's under /visibility. The
visibility (on-demand pending workloads) API server is turned off with its
feature gate (it also needs an APIService to be reachable); the metrics
certificate is bind-mounted there in a private mount namespace of the process
(`unshare --mount`), so the host's /etc gets only the empty mount point. Where
unshare is not allowed, the certificate is copied there instead.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import yaml

from . import crds, gobuild
from .pki import serving_cert
from .poll import wait_for
from .processes import ManagedProcess, free_port, http_ok
from .webhooks import apply_webhooks, delete_webhooks

MODULE: Final = "sigs.k8s.io/kueue"
NAMESPACE: Final = "kueue-system"
# How the HorovodJob is named in Kueue's Configuration (Kind.version.group).
HOROVOD_FRAMEWORK: Final = "HorovodJob.v1alpha1.horovod.ai"
WEBHOOK_NAME_PREFIX: Final = "kueue-"
METRICS_CERT_DIR: Final = Path("/etc/kueue/metrics/certs")
# The visibility server wants certificates under /visibility and an APIService.
GROUP_VERSION: Final = "kueue.x-k8s.io/v1beta2"
# DynamicResourceAllocation (alpha, off by default in v0.17): Kueue counts the devices
# of a Workload's ResourceClaimTemplates against quota, under the logical resource
# names of DRA_RESOURCES (docs/dra.md).
FEATURE_GATES: Final = "VisibilityOnDemand=false,DynamicResourceAllocation=true"
# The quota name of the GPUs of DeviceClass gpu.nvidia.com (resources.deviceClassMappings).
DRA_GPU_RESOURCE: Final = "dra.horovod.ai/gpu"
DRA_RESOURCES: Final = [{"name": DRA_GPU_RESOURCE, "deviceClassNames": ["gpu.nvidia.com"]}]
# The namespaces Kueue's kustomization keeps its pod, Deployment and StatefulSet
# webhooks out of (config/components/webhook/kustomization.yaml).
_SYSTEM_NAMESPACES_SELECTOR: Final = {
    "matchExpressions": [
        {
            "key": "kubernetes.io/metadata.name",
            "operator": "NotIn",
            "values": ["kube-system", NAMESPACE],
        }
    ]
}
_SELECTED_WEBHOOKS: Final = frozenset(
    f"{prefix}{kind}.kb.io" for prefix in "mv" for kind in ("pod", "deployment", "statefulset")
)

Kubectl = Callable[..., "subprocess.CompletedProcess[str]"]


class KueueError(RuntimeError):
    """Kueue could not be installed or started; the message says why."""


def tool() -> gobuild.Tool:
    return gobuild.tool("kueue")


def module_root() -> Path:
    """The Kueue module's sources in the Go module cache (CRDs, config, webhooks)."""
    # Downloaded when missing: the CRDs go in before the binary is built (a fresh
    # machine has neither; this is what failed CI's Kueue tests at setup).
    try:
        return gobuild.module_source(MODULE, tool().version())
    except gobuild.BuildError as error:
        raise KueueError(str(error)) from error


def crd_files() -> list[Path]:
    return sorted((module_root() / "config/components/crd/bases").glob("*.yaml"))


def configuration(
    health_port: int,
    metrics_port: int,
    webhook_port: int,
    cert_dir: Path,
    wait_for_pods_ready: dict[str, Any] | None = None,
    multi_kueue: dict[str, Any] | None = None,
) -> Any:
    """Kueue's Configuration: the module's template, set up to run as a local process.
    `wait_for_pods_ready`: its waitForPodsReady section (Kueue v0.19 turns it on by
    default; v0.17's template leaves it off). `multi_kueue`: its multiKueue section
    (a manager cluster that dispatches HorovodJobs: externalFrameworks)."""
    template = module_root() / "config/components/manager/controller_manager_config.yaml"
    config = yaml.safe_load(template.read_text())
    config["namespace"] = NAMESPACE
    config["health"] = {"healthProbeBindAddress": f"127.0.0.1:{health_port}"}
    config["metrics"] = {"bindAddress": f"127.0.0.1:{metrics_port}"}
    config["webhook"] = {"port": webhook_port, "host": "127.0.0.1", "certDir": str(cert_dir)}
    config["leaderElection"] = {"leaderElect": False}
    config["internalCertManagement"] = {"enable": False}
    integrations = config.setdefault("integrations", {})
    integrations["externalFrameworks"] = [HOROVOD_FRAMEWORK]
    if wait_for_pods_ready is not None:
        config["waitForPodsReady"] = wait_for_pods_ready
    if multi_kueue is not None:
        config["multiKueue"] = multi_kueue
        # A manager connects to a worker cluster only once it watches there the kind of
        # every MultiKueue adapter it has, one per enabled framework (JAXJob, RayJob,
        # AppWrapper, ...: "no matches for kind" otherwise). The local worker serves
        # only the built-in kinds and HorovodJob.
        integrations["frameworks"] = ["batch/job"]
    config.setdefault("resources", {})["deviceClassMappings"] = DRA_RESOURCES
    return config


def webhook_configurations(webhook_port: int, ca_bundle: bytes) -> list[dict[str, Any]]:
    """The module's webhook configurations, pointed at the local process."""
    manifests = module_root() / "config/components/webhook/manifests.yaml"
    docs = [d for d in yaml.safe_load_all(manifests.read_text()) if d]
    bundle = base64.b64encode(ca_bundle).decode()
    for doc in docs:
        doc["metadata"]["name"] = WEBHOOK_NAME_PREFIX + doc["metadata"]["name"]
        for hook in doc.get("webhooks") or ():
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {
                "url": f"https://127.0.0.1:{webhook_port}{path}",
                "caBundle": bundle,
            }
            if hook["name"] in _SELECTED_WEBHOOKS:
                hook["namespaceSelector"] = _SYSTEM_NAMESPACES_SELECTOR
    return docs


def make_serving_cert(out: Path, ca_cert: Path, ca_key: Path) -> None:
    """tls.crt/tls.key for 127.0.0.1, signed by the cluster's CA (the caBundle)."""
    serving_cert(out, "tls", "kueue-webhook", "IP:127.0.0.1,DNS:localhost", ca=(ca_cert, ca_key))


def _unshare_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    proc = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "true"], capture_output=True
    )
    return proc.returncode == 0


class KueueProcess(ManagedProcess):
    """Kueue's controller manager and webhook server against one cluster."""

    name = "Kueue"
    error = KueueError

    def __init__(
        self,
        kubeconfig: Path,
        kubectl: Kubectl,
        pki: Path,
        state: Path,
        log_path: Path,
        wait_for_pods_ready: dict[str, Any] | None = None,
        multi_kueue: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(log_path)
        self.wait_for_pods_ready = wait_for_pods_ready
        self.multi_kueue = multi_kueue
        self.kubeconfig = kubeconfig
        self.kubectl = kubectl
        self.pki = pki
        self.state = state
        self.health_port = free_port()
        self.metrics_port = free_port()
        self.webhook_port = free_port()
        self.webhooks: list[dict[str, Any]] = []

    # --- installing ------------------------------------------------------------------

    def install_crds(self, timeout: float = 120) -> None:
        files = crd_files()
        if not files:
            raise KueueError(f"no CRDs under {module_root()}/config/components/crd/bases")
        names = [yaml.safe_load(f.read_text())["metadata"]["name"] for f in files]
        # CRDs an earlier run deleted (--wait=false) refuse objects until they are gone.
        if self._terminating_crds(names):
            self._drop_finalizers(names)
        wait_for(
            lambda: not self._terminating_crds(names),
            timeout,
            interval=0.5,
            message="Kueue's CRDs from an earlier install gone",
            error=KueueError,
        )
        args = [a for f in files for a in ("-f", str(f))]
        self.kubectl("apply", "--server-side", "--force-conflicts", *args, timeout=timeout)
        crds.wait_established(self.kubectl, names, timeout, error=KueueError)
        # Established is not yet served: a loaded API server answered discovery of
        # the group with 503 for a moment, and Kueue exits on that at start.
        wait_for(
            lambda: (
                self.kubectl("get", "--raw", f"/apis/{GROUP_VERSION}", check=False).returncode == 0
            ),
            timeout,
            interval=0.5,
            message=f"{GROUP_VERSION} served",
            error=KueueError,
        )

    def _terminating_crds(self, names: list[str]) -> list[str]:
        proc = self.kubectl("get", "crd", *names, "--ignore-not-found", "-o", "json", check=False)
        if proc.returncode != 0 or not proc.stdout.strip():
            return []
        items = json.loads(proc.stdout).get("items") or []
        return [i["metadata"]["name"] for i in items if i["metadata"].get("deletionTimestamp")]

    def uninstall_crds(self) -> None:
        """Delete Kueue's CRDs (and with them every Kueue object). Kueue's finalizers
        on what is left (a ClusterQueue or flavor in use) would hold the CRDs forever
        once Kueue is gone, so they are dropped."""
        files = crd_files()
        args = [a for f in files for a in ("-f", str(f))]
        self.kubectl("delete", "--ignore-not-found", "--wait=false", *args, check=False)
        self._drop_finalizers([yaml.safe_load(f.read_text())["metadata"]["name"] for f in files])

    def _drop_finalizers(self, crds: list[str]) -> None:
        for crd in crds:
            proc = self.kubectl("get", crd, "-A", "-o", "json", check=False)
            if proc.returncode != 0 or not proc.stdout.strip():
                continue
            for item in json.loads(proc.stdout).get("items") or []:
                meta = item["metadata"]
                if not meta.get("finalizers"):
                    continue
                where = ["-n", meta["namespace"]] if meta.get("namespace") else []
                self.kubectl(
                    "patch", crd, meta["name"], *where, "--type=merge",
                    "-p", '{"metadata":{"finalizers":null}}', check=False,
                )  # fmt: skip

    def _write_config(self) -> Path:
        certs = self.state / "webhook-certs"
        make_serving_cert(certs, self.pki / "ca.crt", self.pki / "ca.key")
        config = configuration(
            self.health_port,
            self.metrics_port,
            self.webhook_port,
            certs,
            self.wait_for_pods_ready,
            self.multi_kueue,
        )
        path = self.state / "controller_manager_config.yaml"
        path.write_text(yaml.safe_dump(config))
        return path

    def argv(self, config: Path) -> list[str]:
        binary = gobuild.ensure("kueue")
        kueue = [str(binary), f"--config={config}", f"--feature-gates={FEATURE_GATES}"]
        certs = self.state / "webhook-certs"
        METRICS_CERT_DIR.mkdir(parents=True, exist_ok=True)
        if _unshare_works():
            # The mount is private to the process; exec keeps its pid the one we stop.
            script = f'mount --bind "{certs}" "{METRICS_CERT_DIR}" && exec "$@"'
            unshare = ["unshare", "--mount", "--propagation", "private"]
            return [*unshare, "sh", "-c", script, "sh", *kueue]
        for name in ("tls.crt", "tls.key"):
            shutil.copy(certs / name, METRICS_CERT_DIR / name)
        return kueue

    # --- running ---------------------------------------------------------------------

    def start(self, timeout: float = 120) -> float:
        """Install the CRDs, start Kueue, install its webhooks and wait until the API
        server calls them. Returns the seconds it took."""
        started = time.monotonic()
        self.state.mkdir(parents=True, exist_ok=True)
        self.install_crds()
        namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
        self.kubectl("apply", "-f", "-", input=json.dumps(namespace))
        argv = self.argv(self._write_config())
        env = {"KUBECONFIG": str(self.kubeconfig), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
        self.launch(argv, env=env)
        deadline = started + timeout
        wait_for(
            self._ready,
            max(1.0, deadline - time.monotonic()),
            interval=0.5,
            message="Kueue ready (/readyz)",
            describe=self._describe,
            error=KueueError,
        )
        self.install_webhooks()
        wait_for(
            lambda: self.webhook_called() and self.mutating_webhook_called(),
            max(1.0, deadline - time.monotonic()),
            interval=0.5,
            message="the API server calling Kueue's Workload and ResourceFlavor webhooks",
            describe=self._describe,
            error=KueueError,
        )
        return time.monotonic() - started

    def _ready(self) -> bool:
        self.check_running()
        return http_ok(f"http://127.0.0.1:{self.health_port}/readyz", timeout=1)

    def install_webhooks(self) -> None:
        ca = (self.pki / "ca.crt").read_bytes()
        self.webhooks = webhook_configurations(self.webhook_port, ca)
        apply_webhooks(self.kubectl, self.webhooks)

    def remove_webhooks(self) -> None:
        """Before the process goes (webhooks.delete_webhooks)."""
        delete_webhooks(self.kubectl, self.webhooks)
        self.webhooks = []

    def webhook_called(self) -> bool:
        """Whether the API server calls Kueue's Workload validation: a server-side dry
        run of a Workload asking for the `pods` resource, which only that webhook
        refuses ("the key is reserved for internal kueue use")."""
        probe = {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "Workload",
            "metadata": {"name": "webhook-probe", "namespace": NAMESPACE},
            "spec": {
                "podSets": [
                    {
                        "name": "main",
                        "count": 1,
                        "template": {
                            "spec": {
                                "containers": [
                                    {
                                        "name": "c",
                                        "image": "probe",
                                        "resources": {"requests": {"pods": "1"}},
                                    }
                                ]
                            }
                        },
                    }
                ]
            },
        }
        proc = self.kubectl(
            "create", "--dry-run=server", "-f", "-", input=json.dumps(probe), check=False
        )
        return proc.returncode != 0 and "reserved for internal kueue use" in proc.stderr

    def mutating_webhook_called(self) -> bool:
        """Whether the API server reaches Kueue's mutating webhooks too: they are another
        configuration object, which the server may still read as the last Kueue's (a
        port nobody listens on) after the validating one is current: the likely cause
        of a CI run's ResourceFlavor refused with "connection refused" just after one
        test module's Kueue stopped and the next one's started (2026-12-06)."""
        probe = {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ResourceFlavor",
            "metadata": {"name": "webhook-probe"},
        }
        proc = self.kubectl(
            "create", "--dry-run=server", "-f", "-", input=json.dumps(probe), check=False
        )
        return proc.returncode == 0

    def stop(self, timeout: float = 20) -> None:
        self.remove_webhooks()
        super().stop(timeout)

    def _describe(self) -> str:
        return f"--- Kueue log ({self.log_path}) ---\n{self.tail()}"
