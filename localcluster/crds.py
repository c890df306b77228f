"""CustomResourceDefinitions on a local cluster: wait until they are Established.

`kubectl wait --for=condition=Established` right after the apply does not wait when
the API server has not written the CRD's conditions yet: it fails at once with
".status.conditions accessor error: <nil> is of the type <nil>". A loaded machine
shows it (a cold CI run's soak lost its cluster to it, 2026-12-07), so every
install here polls the conditions instead.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Sequence

from .poll import wait_for

Kubectl = Callable[..., "subprocess.CompletedProcess[str]"]

HOROVODJOBS = "horovodjobs.horovod.ai"


def established(kubectl: Kubectl, names: Sequence[str]) -> bool:
    """Whether every CRD named is there and Established (False while one is missing)."""
    proc = kubectl("get", "crd", *names, "-o", "json", check=False)
    if proc.returncode != 0:
        return False
    data = json.loads(proc.stdout)
    crds = data.get("items", [data])
    return len(crds) == len(names) and all(
        any(
            c.get("type") == "Established" and c.get("status") == "True"
            for c in (crd.get("status") or {}).get("conditions") or []
        )
        for crd in crds
    )


def wait_established(
    kubectl: Kubectl,
    names: Sequence[str],
    timeout: float = 60,
    error: type[Exception] = TimeoutError,
) -> None:
    """Wait until every CRD named is Established; `error` names them on timeout."""
    wait_for(
        lambda: established(kubectl, names),
        timeout,
        interval=0.3,
        message=f"{', '.join(names)} Established",
        error=error,
    )
