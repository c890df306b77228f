"""localcluster: pinned versions, the Go builder, node objects, and the clear errors
it gives."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from localcluster import gobuild
from localcluster.cluster import KWOK_NODE_LABEL, Cluster, ClusterError, Layout, kwok_node
from localcluster.paths import TOOLS_DIR
from localcluster.versions import read_versions


def test_every_go_mod_pins_the_version_from_versions_env() -> None:
    versions = read_versions()
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
    k8s = read_versions()["KUBERNETES_VERSION"]
    staging = "v0." + k8s.removeprefix("v1.")
    gomod = (TOOLS_DIR / "kubernetes" / "go.mod").read_text()
    replaces = re.findall(r"^\s*(k8s\.io/\S+) => (\S+) (\S+)$", gomod, re.M)
    assert len(replaces) > 25
    assert {v for _, _, v in replaces} == {staging}
    assert all(a == b for a, b, _ in replaces)


def test_kwok_node_advertises_gpus_and_the_selector_label() -> None:
    node: dict[str, Any] = kwok_node("kwok-gpu-0", 8)
    assert node["metadata"]["labels"][KWOK_NODE_LABEL] == "kwok"
    # The scheduler places pods by what is allocatable.
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    assert node["status"]["capacity"]["nvidia.com/gpu"] == "8"


def test_up_refuses_a_port_in_use_and_starts_nothing(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        layout = Layout(root=tmp_path / "c", port_base=port)
        with pytest.raises(ClusterError, match=rf"port {port} .*already in use.*Fix"):
            Cluster(layout).up()
    assert not (tmp_path / "c" / "pids").exists()


def test_build_without_go_names_the_fix(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(gobuild, "CACHE", tmp_path)  # nothing built there
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(gobuild.BuildError, match=r"`go` is not on PATH.*install Go"):
        gobuild.build(["etcd"])


def test_a_built_tool_is_reused_until_its_pin_changes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(gobuild, "CACHE", tmp_path)
    etcd = gobuild.tool("etcd")
    out = etcd.bin_dir()
    out.mkdir(parents=True)
    (out / "etcd").write_text("")
    (out / ".stamp").write_text(etcd.stamp())
    assert etcd.built()
    (out / ".stamp").write_text("a stamp from another go.mod")
    assert not etcd.built()


def _fake_go(bin_dir: Path, record: Path) -> None:
    """A `go` that records the GOCACHE it was given, fills it, and writes the -o file."""
    bin_dir.mkdir()
    go = bin_dir / "go"
    go.write_text(
        "#!/bin/sh\n"
        f'echo "$GOCACHE" >>{record}\n'
        'mkdir -p "$GOCACHE" && echo compiled >"$GOCACHE/package.a"\n'
        'while [ $# -gt 0 ]; do [ "$1" = -o ] && : >"$2"; shift; done\n'
    )
    go.chmod(0o755)


def _fake_go_builds(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """gobuild with its cache and lock under tmp_path and _fake_go on PATH; the file
    that records each GOCACHE the fake was given."""
    monkeypatch.setattr(gobuild, "CACHE", tmp_path / "cache")
    monkeypatch.setattr(gobuild, "HEAVY_LOCK", tmp_path / "heavy.lock")
    record = tmp_path / "gocache.txt"
    _fake_go(tmp_path / "bin", record)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    return record


def test_go_build_cache_is_shared_capped_and_the_users_own_is_kept(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    record = _fake_go_builds(monkeypatch, tmp_path)
    monkeypatch.delenv("GOCACHE", raising=False)
    gobuild.build(["etcd", "kwok"])
    # One cache for every tool (the standard library compiles once), kept under its cap.
    used = {Path(line) for line in record.read_text().split()}
    assert used == {tmp_path / "cache" / "go-build"}
    assert (tmp_path / "cache" / "go-build" / "package.a").exists()
    assert gobuild.tool("etcd").built() and gobuild.tool("kwok").built()

    # Over its cap after a build, its oldest entries go until 70 % of the cap is left.
    shared = tmp_path / "cache" / "go-build"
    for age, name in enumerate(("new", "middle", "old")):
        entry = shared / "ab" / f"{name}-d"
        entry.parent.mkdir(parents=True, exist_ok=True)
        entry.write_bytes(b"x" * 400)
        os.utime(entry, (1e9 - age * 1000, 1e9 - age * 1000))
    monkeypatch.setenv("HVK_GO_BUILD_CACHE_MAX_GB", str(1000 / 1e9))  # 1,000 bytes
    shutil.rmtree(gobuild.tool("etcd").bin_dir())
    gobuild.build(["etcd"])
    left = sorted(p.name for p in shared.rglob("*") if p.is_file())
    # 1,209 bytes: the two oldest go (809, then 409 <= 700); the newest entry and the
    # build's own output stay.
    assert left == ["new-d", "package.a"], left

    # A GOCACHE the user set is theirs: used, and kept whatever its size.
    own = tmp_path / "own-gocache"
    monkeypatch.setenv("GOCACHE", str(own))
    shutil.rmtree(gobuild.tool("etcd").bin_dir())
    gobuild.build(["etcd"])
    assert record.read_text().split()[-1] == str(own)
    assert (own / "package.a").exists()


def test_a_build_that_hangs_is_stopped_and_named(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Tests wait for builds outside their own timeout (timeout_func_only): the build's
    # own limit is what stops a hung one.
    _fake_go_builds(monkeypatch, tmp_path)
    (tmp_path / "bin" / "go").write_text("#!/bin/sh\nexec sleep 30\n")
    monkeypatch.setenv("HVK_GO_BUILD_TIMEOUT", "0.5")
    started = time.monotonic()
    with pytest.raises(gobuild.BuildError, match="HVK_GO_BUILD_TIMEOUT") as error:
        gobuild.build(["etcd"])
    assert time.monotonic() - started < 10
    assert "took over 0s" in str(error.value) or "took over 1s" in str(error.value)
    assert not gobuild.tool("etcd").built()


def test_a_tool_built_while_waiting_for_the_lock_is_not_built_again(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    record = _fake_go_builds(monkeypatch, tmp_path)
    etcd = gobuild.tool("etcd")
    real_lock = gobuild._heavy_lock

    @contextlib.contextmanager
    def another_process_builds_it_first() -> Iterator[None]:
        with real_lock():
            etcd.bin_dir().mkdir(parents=True, exist_ok=True)
            (etcd.bin_dir() / "etcd").write_text("")
            (etcd.bin_dir() / ".stamp").write_text(etcd.stamp())
            yield

    monkeypatch.setattr(gobuild, "_heavy_lock", another_process_builds_it_first)
    gobuild.ensure("etcd")
    assert not record.exists(), "go was run for a tool that was built meanwhile"


def test_unknown_tools_are_refused_by_name() -> None:
    with pytest.raises(gobuild.BuildError, match=r"unknown tools \['nope'\]"):
        gobuild.build(["nope"])


def test_set_pod_phase_rejects_unknown_phases(tmp_path: Path) -> None:
    cluster = Cluster(Layout(root=tmp_path))
    with pytest.raises(ValueError, match="Succeeded or Failed"):
        cluster.set_pod_phase("ns", "pod", "Running")
