"""The control plane a benchmark starts for itself, and the HorovodJob CRD on it:
the set-up the standalone benchmarks (ceiling, memory, silent_node, soak, takeover)
share."""

from __future__ import annotations

from pathlib import Path

from localcluster import crds, gobuild
from localcluster.cluster import Cluster, Layout
from localcluster.paths import REPO

HV_CRD = REPO / "crds" / "horovod.ai_horovodjobs.yaml"


def fresh(root: str | Path, port_base: int) -> Cluster:
    """A control plane under `root` on ports from `port_base`, started anew: whatever
    a previous run left there is stopped first; the Go binaries are built if needed."""
    cluster = Cluster(Layout(root=Path(root).resolve(), port_base=port_base))
    cluster.down(quiet=True)
    gobuild.build()
    cluster.up()
    return cluster


def install_horovod_crd(cluster: Cluster) -> None:
    """The HorovodJob CRD, applied and Established."""
    cluster.kubectl("apply", "--server-side", "-f", str(HV_CRD))
    crds.wait_established(cluster.kubectl, [crds.HOROVODJOBS])
