"""The local control plane as tests see it (kubectl, helm, pod phases, log tails),
a session-scoped one, and a fresh namespace per test. The fixtures that use
them are in fixtures.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from localcluster import gobuild
from localcluster.cluster import Cluster, ClusterError, Layout
from localcluster.poll import wait_for
from tests.support.kube_reads import Reads


class KubeCluster(Cluster):
    """What tests get of the local control plane: kubectl and helm that fail as test
    assertions with their output, JSON getters, and the logs for failure reports."""

    def __init__(self, layout: Layout):
        super().__init__(layout)
        self.kubeconfig = layout.kubeconfig
        self.logs_dir = layout.logs
        self.bin_dir = layout.bin
        self.env = {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig),
            "PATH": f"{self.bin_dir}:{os.environ['PATH']}",
        }
        # get() and exists() over HTTP where that is certain; kubectl otherwise.
        self.reads = Reads(self.kubeconfig)

    def kubectl(
        self, *args: str, check: bool = True, input: str | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        proc = super().kubectl(*args, check=False, input=input, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(
                f"kubectl {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}{proc.stdout}"
            )
        return proc

    def helm(
        self, *args: str, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [str(self.bin_dir / "helm"), f"--kubeconfig={self.kubeconfig}", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env,
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"helm {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}{proc.stdout}"
            )
        return proc

    def get(
        self,
        kind: str,
        name: str | None = None,
        namespace: str | None = None,
        selector: str | None = None,
    ) -> Any:
        read = self.reads.get(kind, name, namespace, selector)
        if read is not None and read[0] == 200:
            return read[1]
        args = ["get", kind, "-o", "json"]
        if name:
            args.insert(2, name)
        if namespace:
            args += ["-n", namespace]
        if selector:
            args += ["-l", selector]
        return json.loads(self.kubectl(*args).stdout)

    def exists(self, kind: str, name: str, namespace: str | None = None) -> bool:
        read = self.reads.get(kind, name, namespace)
        if read is not None:
            return read[0] == 200
        args = ["get", kind, name, "--ignore-not-found", "-o", "name"]
        if namespace:
            args += ["-n", namespace]
        return bool(self.kubectl(*args).stdout.strip())

    def apply(
        self,
        manifest: str | dict[str, Any],
        namespace: str | None = None,
        check: bool = True,
        *extra: str,
    ) -> subprocess.CompletedProcess[str]:
        text = manifest if isinstance(manifest, str) else json.dumps(manifest)
        args = ["apply", "-f", "-", *extra]
        if namespace:
            args += ["-n", namespace]
        return self.kubectl(*args, input=text, check=check)

    @contextmanager
    def watch(self, kind: str, name: str, namespace: str) -> Iterator[list[dict[str, Any]]]:
        """Every version of one object the API server stores while the block runs, in
        order (a watch, so none is missed the way polling misses them). Fails when the
        watch ended early, since the list would then be short."""
        proc = subprocess.Popen(
            [str(gobuild.bin_path("kubectl")), f"--kubeconfig={self.kubeconfig}", "get", kind,
             "-n", namespace, f"--field-selector=metadata.name={name}", "--watch",
             "--output-watch-events", "-o", "json"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        seen: list[dict[str, Any]] = []

        def read() -> None:
            assert proc.stdout is not None
            decoder, buffer = json.JSONDecoder(), ""
            for line in proc.stdout:
                buffer += line
                while buffer.strip():
                    try:
                        event, end = decoder.raw_decode(buffer.lstrip())
                    except json.JSONDecodeError:
                        break  # an object still being written
                    buffer = buffer.lstrip()[end:]
                    seen.append(event["object"])

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            yield seen
            ended = proc.poll()
            assert ended is None, f"the watch on {kind} {name} ended ({ended}): " + (
                proc.stderr.read() if proc.stderr else ""
            )
        finally:
            proc.terminate()
            proc.wait(timeout=10)
            reader.join(timeout=10)

    def log_tails(self, lines: int = 30) -> str:
        out = []
        for path in sorted(self.logs_dir.glob("*.log")):
            text = path.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"==> {path} <==\n" + "\n".join(text))
        return "\n".join(out)


@contextmanager
def session_cluster(
    env_prefix: str, default_dir: Path, default_port: int, audit: bool = False
) -> Iterator[KubeCluster]:
    """A local control plane for one test session, torn down even when tests fail.

    <prefix>_REUSE=<state dir> uses one started with `hack/cluster.sh up` (and
    leaves it running); otherwise one is started in <prefix>_DIR on the ports from
    <prefix>_PORT_BASE, so a demo cluster can keep running beside it.
    """
    reuse = os.environ.get(f"{env_prefix}_REUSE")
    if reuse:
        reused = KubeCluster(Layout.load(Path(reuse)))
        if not reused.status()["apiserver_ready"]:
            pytest.fail(f"{env_prefix}_REUSE={reuse}: no ready cluster there (hack/cluster.sh up)")
        yield reused
        return
    layout = Layout(
        root=Path(os.environ.get(f"{env_prefix}_DIR", default_dir)),
        port_base=int(os.environ.get(f"{env_prefix}_PORT_BASE", default_port)),
        audit=audit,
    )
    impl = Cluster(layout)
    impl.down(quiet=True)  # what a crashed earlier run left
    gobuild.build()
    try:
        impl.up()
    except ClusterError as exc:
        pytest.fail(f"the local control plane did not start: {exc}")
    try:
        yield KubeCluster(layout)
    finally:
        impl.down(quiet=True)


@contextmanager
def fresh_namespace(cluster: KubeCluster, test_name: str) -> Iterator[str]:
    """A namespace named after the test, with its default ServiceAccount in place."""
    slug = re.sub(r"[^a-z0-9-]+", "-", test_name.lower()).strip("-")[:40].strip("-")
    with named_namespace(cluster, f"{slug}-{uuid.uuid4().hex[:5]}") as name:
        yield name


@contextmanager
def named_namespace(cluster: KubeCluster, name: str) -> Iterator[str]:
    """Namespace `name` (one of the same name on a second cluster, say), with its
    default ServiceAccount in place."""
    cluster.kubectl("create", "namespace", name)
    # Pods are refused until the ServiceAccount controller made "default".
    wait_for(
        lambda: cluster.exists("serviceaccount", "default", name),
        30,
        message=f"serviceaccount default in {name}",
    )
    try:
        yield name
    finally:
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)
