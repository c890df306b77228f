"""The CI guard: a missing prerequisite narrows a developer's run, and fails CI."""

from __future__ import annotations

import pytest

from tests.support.prerequisites import available


def test_a_missing_part_is_left_out_on_a_developers_machine(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("CI", raising=False)
    assert available(True, "x") is True
    assert available(False, "port 8080 free") is False


def test_a_missing_part_fails_under_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    assert available(True, "x") is True
    with pytest.raises(pytest.fail.Exception, match="CI must have this: port 8080 free"):
        available(False, "port 8080 free")
