"""localcluster.crds: a CRD counts as installed once its Established condition is True,
and not before (no conditions yet is what made `kubectl wait` fail at once)."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from localcluster import crds

Completed = subprocess.CompletedProcess[str]


def _crd(name: str, conditions: list[dict[str, str]] | None) -> dict[str, Any]:
    status = {} if conditions is None else {"conditions": conditions}
    return {"kind": "CustomResourceDefinition", "metadata": {"name": name}, "status": status}


def _kubectl(answer: dict[str, Any] | None) -> crds.Kubectl:
    """kubectl get crd ... -o json answering `answer` (None: not found, exit 1)."""

    def run(*args: str, check: bool = True, timeout: float = 60) -> Completed:
        assert args[:2] == ("get", "crd") and not check, args
        if answer is None:
            return subprocess.CompletedProcess(args, 1, "", "NotFound")
        return subprocess.CompletedProcess(args, 0, json.dumps(answer), "")

    return run


ESTABLISHED = [
    {"type": "NamesAccepted", "status": "True"},
    {"type": "Established", "status": "True"},
]


@pytest.mark.parametrize(
    ("answer", "names", "expected"),
    [
        (None, ["a.x"], False),
        (_crd("a.x", None), ["a.x"], False),  # just applied: no conditions written yet
        (_crd("a.x", [{"type": "Established", "status": "False"}]), ["a.x"], False),
        (_crd("a.x", ESTABLISHED), ["a.x"], True),
        ({"items": [_crd("a.x", ESTABLISHED), _crd("b.x", None)]}, ["a.x", "b.x"], False),
        ({"items": [_crd("a.x", ESTABLISHED), _crd("b.x", ESTABLISHED)]}, ["a.x", "b.x"], True),
        ({"items": [_crd("a.x", ESTABLISHED)]}, ["a.x", "b.x"], False),
    ],
)
def test_established_only_with_the_condition_true_on_every_crd(
    answer: dict[str, Any] | None, names: list[str], expected: bool
) -> None:
    assert crds.established(_kubectl(answer), names) is expected


def test_wait_established_names_the_crds_when_it_times_out() -> None:
    with pytest.raises(TimeoutError, match=r"a\.x Established"):
        crds.wait_established(_kubectl(_crd("a.x", None)), ["a.x"], timeout=0.5)
