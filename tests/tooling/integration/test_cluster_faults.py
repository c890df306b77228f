"""A component that fails at start-up leaves no process and no state behind."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from localcluster import cluster as cluster_module
from localcluster import gobuild
from localcluster.cluster import Cluster, ClusterError, Component, Layout, components


def _processes_mentioning(text: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text.encode() in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
            except OSError:
                continue
    return [p for p in pids if p != os.getpid()]


def test_a_failed_start_stops_everything_it_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_components = components

    def broken_scheduler(layout: Layout) -> list[Component]:
        comps = real_components(layout)
        for comp in comps:
            if comp.name == "kube-scheduler":
                comp.argv.append("--no-such-flag")
        return comps

    monkeypatch.setattr(cluster_module, "components", broken_scheduler)
    root = tmp_path / "broken"
    layout = Layout(root=root, port_base=18400, kwok_nodes=1)
    gobuild.build()
    with pytest.raises(ClusterError, match="kube-scheduler exited during start-up"):
        Cluster(layout).up()
    assert _processes_mentioning(str(root)) == []
    assert not root.exists()
