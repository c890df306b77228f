"""The kind node image's pure parts: its config, its component images, the
runtime wrapper that lets privileged containers start on hosts short of a
capability."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
from pathlib import Path
from types import ModuleType

import yaml

from localcluster import kindnode
from localcluster.paths import HACK
from localcluster.versions import read_versions


def test_config_tells_kubeadm_the_tags_the_image_carries_and_allows_cgroup_v1() -> None:
    docs = [yaml.safe_load(d) for d in yaml.safe_load(kindnode.config())["kubeadmConfigPatches"]]
    cluster = next(d for d in docs if d["kind"] == "ClusterConfiguration")
    kubelet = next(d for d in docs if d["kind"] == "KubeletConfiguration")
    assert cluster["etcd"]["local"]["imageTag"] == read_versions()["ETCD_VERSION"]
    assert cluster["dns"]["imageTag"] == kindnode.coredns_tag()
    assert kubelet["failCgroupV1"] is False


def test_components_are_named_as_kubeadm_pulls_them() -> None:
    k8s = read_versions()["KUBERNETES_VERSION"]
    images = {c.binary: c.image for c in kindnode.components("registry.k8s.io/pause:3.10.2")}
    assert images["kube-apiserver"] == f"registry.k8s.io/kube-apiserver:{k8s}"
    assert images["kube-proxy"] == f"registry.k8s.io/kube-proxy:{k8s}"
    assert images["coredns"].startswith("registry.k8s.io/coredns/coredns:")
    assert images["pause"] == "registry.k8s.io/pause:3.10.2"
    assert kindnode.image_name() == f"horovod-kind-node:{k8s}"


def _wrapper() -> ModuleType:
    path = HACK / "docker" / "runc-within-bounds"
    loader = importlib.machinery.SourceFileLoader("runc_within_bounds", str(path))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_wrapper_finds_the_spec_of_create_and_the_process_file_of_exec(tmp_path: Path) -> None:
    wrapper = _wrapper()
    assert wrapper.spec_files(["--root", "/r", "create", "--bundle", "/b", "id"]) == [
        ("/b/config.json", True)
    ]
    assert wrapper.spec_files(["exec", "--process", "/p.json", "id"]) == [("/p.json", False)]
    assert wrapper.spec_files(["state", "id"]) == []


def test_wrapper_keeps_only_capabilities_in_the_bounding_set(tmp_path: Path) -> None:
    wrapper = _wrapper()
    allowed = wrapper.bounding_set()
    spec = {
        "process": {
            "capabilities": {
                "bounding": ["CAP_CHOWN", "CAP_NOT_A_REAL_ONE"],
                "effective": ["CAP_NOT_A_REAL_ONE"],
            }
        }
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(spec))
    wrapper.trim(str(path), True)
    caps = json.loads(path.read_text())["process"]["capabilities"]
    assert caps["effective"] == []
    assert caps["bounding"] == (["CAP_CHOWN"] if "CAP_CHOWN" in allowed else [])
