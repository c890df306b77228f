"""The GitHub workflows, which cannot run here: their shape, checked.

Actions pinned by a full commit SHA (a tag can be moved), least permissions
declared at the top (and widened per job only where a job writes), every `run`
step a script that exists here when it names one."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from localcluster.paths import REPO

WORKFLOWS = sorted((REPO / ".github" / "workflows").glob("*.yaml"))
PINNED = re.compile(r"^[\w.-]+/[\w.-]+@[0-9a-f]{40}$")


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_actions_are_pinned_and_permissions_least(path: Path) -> None:
    workflow = yaml.safe_load(path.read_text())
    assert workflow["permissions"] == {"contents": "read"}, "least permissions at the top"
    for name, job in workflow["jobs"].items():
        for step in job["steps"]:
            if "uses" in step:
                assert PINNED.match(step["uses"]), f"{name}: {step['uses']} is not pinned by SHA"
            for script in re.findall(r"(?:hack|tests)/[\w./-]+\.sh", step.get("run", "")):
                assert (REPO / script).exists(), f"{name}: {script} does not exist"
        granted = job.get("permissions") or {}
        assert set(granted.values()) <= {"read", "write"}, granted
        if path.name != "release.yaml":
            assert "write" not in granted.values(), f"{name} needs no write access"


def test_both_workflows_exist() -> None:
    assert {p.name for p in WORKFLOWS} >= {"kind-e2e.yaml", "release.yaml"}
