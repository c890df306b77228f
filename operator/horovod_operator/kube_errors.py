"""The API's refusals as the operator raises them (kube.Kube)."""

from __future__ import annotations


class NotLeader(Exception):
    """A write refused before it was sent: this replica cannot prove it holds the
    leader Lease now (leader.py), so another may already act."""


class KubeError(Exception):
    """An API error response, with the HTTP status and the server's message."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message

    @property
    def conflict(self) -> bool:
        return self.status == 409

    @property
    def not_found(self) -> bool:
        return self.status == 404
