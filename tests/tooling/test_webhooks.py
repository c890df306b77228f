"""Installing and removing a local process's webhook configurations (kubectl calls)."""

from __future__ import annotations

import json
import subprocess
from typing import Any

from localcluster.webhooks import apply_webhooks, delete_webhooks

DOCS = [
    {"kind": "MutatingWebhookConfiguration", "metadata": {"name": "local-m"}},
    {"kind": "ValidatingWebhookConfiguration", "metadata": {"name": "local-v"}},
]


def test_applied_together_and_deleted_one_by_one_without_failing_on_missing() -> None:
    calls: list[tuple[tuple[str, ...], dict[str, Any]]] = []

    def kubectl(*args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        calls.append((args, kwargs))
        return subprocess.CompletedProcess(list(args), 0, "", "")

    apply_webhooks(kubectl, DOCS)
    ((args, kwargs),) = calls
    assert args == ("apply", "--server-side", "--force-conflicts", "-f", "-")
    assert [json.loads(d) for d in kwargs["input"].split("\n---\n")] == DOCS
    calls.clear()
    delete_webhooks(kubectl, DOCS)
    assert [c[0] for c in calls] == [
        ("delete", "mutatingwebhookconfiguration", "local-m", "--ignore-not-found"),
        ("delete", "validatingwebhookconfiguration", "local-v", "--ignore-not-found"),
    ]
    assert all(c[1] == {"check": False} for c in calls)
