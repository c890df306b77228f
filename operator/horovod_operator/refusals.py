"""How the operator treats an API server's refusal of a write: one classification
for every write the executor makes."""

from __future__ import annotations

from typing import Final

# Refusals that no retry can fix: the object itself is invalid (400, 422) or too
# large for the API server (413).
PERMANENT_CODES: Final = frozenset({400, 413, 422})


def refused(status: int) -> bool:
    """Whether a create's failure is reported on the job (Stalled, an Event) and tried
    again after a backoff: a refusal (403; 400, 413, 422 are permanent), throttling
    (429) or a server error (5xx: a webhook down with failurePolicy Fail). Those were
    once only retried, and a job said "0/2 ready" for 20 minutes without a cause."""
    return status in (400, 403, 413, 422, 429) or status >= 500


def permanent(status: int) -> bool:
    """Whether a refusal stands until the job's spec changes (InvalidSpec on a job that
    never started); the others are retried with backoff."""
    return status in PERMANENT_CODES
