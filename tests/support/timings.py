"""Timings a test measures on its way (apply to first step, to the end), kept in
.work/timings/<rung>.json so that rungs can be compared after a run; docs quote them."""

from __future__ import annotations

import json

from localcluster.paths import WORK


def record_timing(rung: str, name: str, **values: float | None) -> None:
    path = WORK / "timings" / f"{rung}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    recorded = json.loads(path.read_text()) if path.exists() else {}
    recorded[name] = values
    path.write_text(json.dumps(recorded, indent=2, sort_keys=True) + "\n")
    print(f"[timing] {rung} {name}: {values}")
