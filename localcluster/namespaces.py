"""Namespaces as the harness needs them: usable (pods are refused until the
ServiceAccount controller has made `default`), and gone before the next run."""

from __future__ import annotations

from .kube import Client
from .poll import wait_for


def create_namespace(client: Client, name: str, timeout: float = 60) -> str:
    """Create `name` and wait for its default ServiceAccount."""
    client.create("/api/v1/namespaces", {"metadata": {"name": name}})
    wait_for(
        lambda: client.get(f"/api/v1/namespaces/{name}/serviceaccounts/default") is not None,
        timeout,
        message=f"serviceaccount default in {name}",
        error=TimeoutError,
    )
    return name
