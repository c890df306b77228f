"""Webhook configurations of a local webhook process (Kueue, Trainer, JobSet): put
in before the API server needs them, taken out before the process goes."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Sequence
from typing import Any

Kubectl = Callable[..., "subprocess.CompletedProcess[str]"]


def apply_webhooks(kubectl: Kubectl, docs: Sequence[dict[str, Any]]) -> None:
    kubectl(
        "apply", "--server-side", "--force-conflicts", "-f", "-",
        input="\n---\n".join(json.dumps(doc) for doc in docs),
    )  # fmt: skip


def delete_webhooks(kubectl: Kubectl, docs: Sequence[dict[str, Any]]) -> None:
    """A failurePolicy=Fail webhook nobody answers would refuse every write it covers."""
    for doc in docs:
        kind = doc["kind"].lower()
        kubectl("delete", kind, doc["metadata"]["name"], "--ignore-not-found", check=False)
