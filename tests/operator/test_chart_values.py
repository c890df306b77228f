"""The Helm chart's static promises: versions tied to the package, every value
documented in place and covered by the schema. (Rendering and installing are
tested against the control plane in tests/operator/integration/test_chart.py.)"""

from __future__ import annotations

import json
import tomllib
from typing import Any

import yaml

from localcluster.paths import REPO

CHART = REPO / "charts" / "horovod-operator"


def test_chart_versions_follow_the_package() -> None:
    package = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["version"] == package
    assert chart["appVersion"] == package


def test_every_top_level_value_is_documented_in_place() -> None:
    lines = (CHART / "values.yaml").read_text().splitlines()
    undocumented = []
    for i, line in enumerate(lines):
        if line and not line.startswith((" ", "#")) and ":" in line:
            previous = next((p for p in reversed(lines[:i]) if p.strip()), "")
            nested_doc = any(
                ln.strip().startswith("#") for ln in lines[i + 1 : i + 3] if ln.startswith(" ")
            )
            if not previous.startswith("#") and not nested_doc:
                undocumented.append(line.split(":")[0])
    assert undocumented == []


def _keys(values: dict[str, Any], schema: dict[str, Any], prefix: str = "") -> list[str]:
    """Keys of values.yaml that the schema does not describe."""
    missing = []
    props = schema.get("properties", {})
    for key, value in values.items():
        if key not in props:
            missing.append(prefix + key)
        elif isinstance(value, dict) and props[key].get("properties"):
            missing += _keys(value, props[key], f"{prefix}{key}.")
    return missing


def test_schema_describes_every_value_and_forbids_others() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert _keys(values, schema) == []
    assert schema["additionalProperties"] is False
