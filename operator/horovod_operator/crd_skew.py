"""Whether the installed HorovodJob CRD is older than this operator's own.

Helm installs a chart's CRDs once and never upgrades them, so `helm upgrade`
without applying the new CRD leaves the old schema in place, and the API
server prunes every field the operator writes that the old schema lacks,
silently (an old CRD without status.uncountedRestarts made disruptions spend
backoffLimit). Checked at start: the schema fields this operator's models have
(crd.py) that the installed version lacks are named in the log, a metric and a
Warning Event, with the command that fixes it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from .api import GROUP, PLURAL, VERSION

CRD_NAME: Final = f"{PLURAL}.{GROUP}"
FIX: Final = (
    "kubectl apply --server-side --force-conflicts -f charts/horovod-operator/crds/ "
    "(from the chart of this operator's version; Helm never upgrades a chart's CRDs)"
)


def _schema(crd: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for version in (crd.get("spec") or {}).get("versions") or ():
        if version.get("name") == VERSION:
            return ((version.get("schema") or {}).get("openAPIV3Schema")) or {}
    return None


def missing_fields(
    installed: Mapping[str, Any], own: Mapping[str, Any], path: str = ""
) -> list[str]:
    """Field paths `own` has and `installed` lacks (where installed prunes unknown fields)."""
    if installed.get("x-kubernetes-preserve-unknown-fields"):
        return []
    missing: list[str] = []
    theirs = installed.get("properties") or {}
    for name, sub in (own.get("properties") or {}).items():
        here = f"{path}.{name}" if path else name
        if name not in theirs:
            missing.append(here)
        else:
            missing += missing_fields(theirs[name], sub, here)
    if "items" in own and "items" in installed:
        missing += missing_fields(installed["items"], own["items"], f"{path}[]")
    if isinstance(own.get("additionalProperties"), Mapping) and isinstance(
        installed.get("additionalProperties"), Mapping
    ):
        missing += missing_fields(
            installed["additionalProperties"], own["additionalProperties"], f"{path}{{}}"
        )
    return missing


def outdated(installed: Mapping[str, Any], own: Mapping[str, Any]) -> list[str]:
    """What the installed CRD lacks of this operator's (its served version, `VERSION`);
    the version itself when it does not serve it."""
    theirs, ours = _schema(installed), _schema(own)
    if ours is None:
        return []
    if theirs is None:
        return [f"version {VERSION}"]
    return missing_fields(theirs, ours)


def message(missing: list[str]) -> str:
    shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
    return (
        f"the installed CRD {CRD_NAME} is older than this operator: it lacks {shown}, and the "
        f"API server drops what the operator writes there. Fix: {FIX}"
    )
