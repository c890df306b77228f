"""The spec a started job runs on, kept where a restarted operator finds it (pure).

A started job whose edit fails validation keeps running on the spec it last
accepted (decide.py). That spec must outlive the operator's memory: after a
restart or a failover a job with a rejected edit would otherwise have no spec to
finish on, and would sit in Running holding its GPUs. It is kept as two
annotations of the job's ConfigMap, which the operator owns and already watches:
the generation, cheap to compare on every reconcile, and the spec itself (compact
JSON, written when the ConfigMap is created and once per accepted edit; the
ConfigMap's pods mount only its listed keys, never its annotations).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

from pydantic import ValidationError

from .api import HorovodJobSpec

Obj = dict[str, Any]

GENERATION: Final = "horovod.ai/accepted-generation"
SPEC: Final = "horovod.ai/accepted-spec"
ANNOTATIONS: Final = (GENERATION, SPEC)
# Kubernetes caps an object's annotations at 256 KiB together. A bigger spec is not
# kept (only its generation, so that nothing rewrites it): a rejected edit of such a
# job after a restart is reported and the job is left alone, as before.
MAX_SPEC_BYTES: Final = 128 * 1024


def record(generation: int, spec: Mapping[str, Any]) -> dict[str, str]:
    """The annotations that record `spec` as accepted at `generation`."""
    text = json.dumps(spec, separators=(",", ":"), sort_keys=True)
    if len(text.encode()) > MAX_SPEC_BYTES:
        return {GENERATION: str(generation)}
    return {GENERATION: str(generation), SPEC: text}


def generation(config_map: Mapping[str, Any] | None) -> int | None:
    """The generation the ConfigMap records as accepted, if any."""
    value = _annotations(config_map).get(GENERATION)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def recorded(config_map: Mapping[str, Any] | None) -> tuple[int, Obj] | None:
    """(generation, raw spec) the ConfigMap records, if it holds a readable one."""
    number = generation(config_map)
    text = _annotations(config_map).get(SPEC)
    if number is None or text is None:
        return None
    try:
        spec = json.loads(text)
    except ValueError:
        return None
    return (number, spec) if isinstance(spec, dict) else None


def _annotations(config_map: Mapping[str, Any] | None) -> Mapping[str, str]:
    if config_map is None:
        return {}
    return (config_map.get("metadata") or {}).get("annotations") or {}


def parsed(spec: Mapping[str, Any], default_image: str | None) -> HorovodJobSpec | None:
    """The recorded spec as the operator reads a job's (None if it no longer parses:
    a hand-edited record counts as none, and the job is then left alone)."""
    try:
        return HorovodJobSpec.model_validate(spec, context={"default_image": default_image})
    except ValidationError:
        return None
