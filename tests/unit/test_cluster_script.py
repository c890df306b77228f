"""hack/cluster.py: pinned versions, node objects, and the clear errors it gives."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import cluster as localcluster
import pytest

TOOLS_DIR = Path(localcluster.HACK) / "tools"


def test_every_go_mod_pins_the_version_from_versions_env() -> None:
    versions = localcluster.read_versions()
    modules = {
        "kubernetes": ("k8s.io/kubernetes", versions["KUBERNETES_VERSION"]),
        "etcd": ("go.etcd.io/etcd/server/v3", versions["ETCD_VERSION"]),
        "kwok": ("sigs.k8s.io/kwok", versions["KWOK_VERSION"]),
        "helm": ("helm.sh/helm/v3", versions["HELM_VERSION"]),
    }
    for tool, (module, version) in modules.items():
        gomod = (TOOLS_DIR / tool / "go.mod").read_text()
        assert re.search(
            rf"^\s*(require\s+)?{re.escape(module)} {re.escape(version)}( // indirect)?$",
            gomod,
            re.M,
        ), f"hack/tools/{tool}/go.mod does not require {module} {version} (hack/versions.env)"


def test_kubernetes_staging_modules_match_the_kubernetes_release() -> None:
    k8s = localcluster.read_versions()["KUBERNETES_VERSION"]
    staging = "v0." + k8s.removeprefix("v1.")
    gomod = (TOOLS_DIR / "kubernetes" / "go.mod").read_text()
    replaces = re.findall(r"^\s*(k8s\.io/\S+) => (\S+) (\S+)$", gomod, re.M)
    assert len(replaces) > 25
    assert {v for _, _, v in replaces} == {staging}
    assert all(a == b for a, b, _ in replaces)


def test_kwok_node_advertises_gpus_and_the_selector_label() -> None:
    node = localcluster.kwok_node("kwok-gpu-0", 8)
    assert node["metadata"]["labels"][localcluster.KWOK_NODE_LABEL] == "kwok"  # type: ignore[index]
    assert node["status"]["capacity"]["nvidia.com/gpu"] == "8"  # type: ignore[index]
    assert node["status"]["allocatable"] == node["status"]["capacity"]  # type: ignore[index]


def test_up_refuses_a_port_in_use_and_starts_nothing(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        layout = localcluster.Layout(root=tmp_path / "c", port_base=port)
        with pytest.raises(localcluster.ClusterError, match=rf"port {port} .*already in use.*Fix"):
            localcluster.Cluster(layout).up()
    assert not (tmp_path / "c" / "pids").exists()


def test_build_without_go_names_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(localcluster.ClusterError, match=r"`go` is not on PATH.*Install Go"):
        localcluster.build()


def test_set_pod_phase_rejects_unknown_phases(tmp_path: Path) -> None:
    cluster = localcluster.Cluster(localcluster.Layout(root=tmp_path))
    with pytest.raises(ValueError, match="Succeeded or Failed"):
        cluster.set_pod_phase("ns", "pod", "Running")
