"""Converted MPIJobs pass the API server's own validation of a HorovodJob (the CRD's
schema and CEL rules), not only the operator's models."""

from __future__ import annotations

import yaml

from horovod_operator.sdk.convert import convert
from tests.operator.test_sdk_convert import MPIJOB
from tests.support.cluster import KubeCluster


def test_a_converted_mpijob_is_accepted_by_the_api_server(
    cluster: KubeCluster, crd: None, namespace: str
) -> None:
    job, _ = convert(MPIJOB)
    proc = cluster.kubectl(
        "apply", "--dry-run=server", "-n", namespace, "-f", "-",
        input=yaml.safe_dump(job), check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "created (server dry run)" in proc.stdout
