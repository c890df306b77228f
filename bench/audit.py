"""API requests per operator from the API server's audit log (pure parsing).

The cluster runs with a Metadata-level audit policy (`Layout.audit`, or
`hack/cluster.sh up --audit`), one JSON event per line. Each request is
counted once (by auditID), attributed to an operator by its User-Agent prefix
and to a scenario by the namespace of the
object it touched. Cluster-scoped requests of the operator (its watches and
lists across namespaces, leader election leases elsewhere) are counted apart:
they are a cost of running, not of a job.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

# mpi-operator's leader-election Lease lives in the jobs' namespace in these runs (the
# harness points --lock-namespace there); it is a cost of running, not of a job.
NOT_PER_JOB = frozenset({"leases"})
WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})


def request_key(event: dict[str, Any]) -> str:
    """`verb resource[/subresource]`, e.g. `create pods`, `patch horovodjobs/status`;
    a refused request gets its code after it, `create jobs (409)`: it cost the API
    server a request but made nothing, and an operator that tries a create twice (a
    stale cache) is told apart from one that creates twice."""
    ref = event.get("objectRef") or {}
    resource = ref.get("resource") or event.get("requestURI", "?")
    if ref.get("subresource"):
        resource = f"{resource}/{ref['subresource']}"
    key = f"{event.get('verb', '?')} {resource}"
    code = (event.get("responseStatus") or {}).get("code")
    return f"{key} ({code})" if isinstance(code, int) and code >= 400 else key


def count_requests(
    lines: Iterable[str | bytes], user_agents: Sequence[str], namespaces: Sequence[str]
) -> dict[str, Counter[str]]:
    """Requests by `verb resource` of clients whose User-Agent starts with one of `user_agents`.

    Returns {"namespaced": Counter, "other": Counter}: requests on objects in one
    of `namespaces`, and requests with no namespace or a namespace-wide list/watch
    (those are per-operator, not per-job).
    """
    ns_set = set(namespaces)
    seen: set[str] = set()
    namespaced: Counter[str] = Counter()
    other: Counter[str] = Counter()
    needles = [ns.encode() for ns in namespaces]
    for line in lines:
        raw = line.encode() if isinstance(line, str) else line
        if needles and not any(n in raw for n in needles):
            continue
        try:
            event = json.loads(raw)
        except ValueError:
            continue  # a line cut by a batch flush in progress
        agent = event.get("userAgent") or ""
        if not any(agent.startswith(ua) for ua in user_agents):
            continue
        audit_id = event.get("auditID")
        if audit_id in seen:
            continue
        seen.add(audit_id)
        ref = event.get("objectRef") or {}
        key = request_key(event)
        if ref.get("resource") in NOT_PER_JOB:
            other[key] += 1
        elif ref.get("namespace") in ns_set and ref.get("name") and event.get("verb") != "watch":
            namespaced[key] += 1
        elif ref.get("namespace") in ns_set and event.get("verb") in ("create", "deletecollection"):
            # generateName creates (Events) have no name yet; a collection delete (a
            # finished job's workers) names none.
            namespaced[key] += 1
        else:
            other[key] += 1
    return {"namespaced": namespaced, "other": other}


def per_job(counts: Counter[str], jobs: int) -> dict[str, float]:
    """Counts divided by the number of jobs, sorted, with totals of writes and reads."""
    if jobs <= 0:
        return {}
    out = {key: round(n / jobs, 2) for key, n in sorted(counts.items())}
    writes = sum(n for k, n in counts.items() if k.split(" ", 1)[0] in WRITE_VERBS)
    out["writes (total)"] = round(writes / jobs, 2)
    out["all (total)"] = round(sum(counts.values()) / jobs, 2)
    return out
