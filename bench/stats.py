"""Statistics of repeated runs (pure)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any


def percentile(values: Iterable[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation between ranks (numpy's default)."""
    data = sorted(values)
    if not data:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"q must be in [0, 100], not {q}")
    pos = (len(data) - 1) * q / 100
    low = math.floor(pos)
    high = math.ceil(pos)
    return data[low] + (data[high] - data[low]) * (pos - low)


def summarize(values: Iterable[float]) -> dict[str, Any]:
    """n, median, p95, p99, mean, min, max and the raw samples (rounded to the
    millisecond). The p99 says little below 100 samples (it is then near the max)."""
    data = [float(v) for v in values]
    if not data:
        return {"n": 0}
    return {
        "n": len(data),
        "median": round(percentile(data, 50), 4),
        "p95": round(percentile(data, 95), 4),
        "p99": round(percentile(data, 99), 4),
        "mean": round(sum(data) / len(data), 4),
        "min": round(min(data), 4),
        "max": round(max(data), 4),
        "samples": [round(v, 4) for v in data],
    }


def ratio(ours: Mapping[str, Any] | None, theirs: Mapping[str, Any] | None) -> float | None:
    """ours/theirs of the medians; None when either is missing or theirs is zero."""
    if not ours or not theirs or not ours.get("n") or not theirs.get("n"):
        return None
    if not theirs["median"]:
        return None
    return round(float(ours["median"]) / float(theirs["median"]), 3)
