"""horovod_worker.horovodrun against the Horovod built here: the same answers as
horovodrun's own probe, without the probe's framework imports."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from horovod_worker import horovodrun

# Each build probe horovodrun asks, what the shim reads instead, and what replaces it.
PROBES = [
    pytest.param("mpi_built", horovodrun.mpi_linked, horovodrun.answer_mpi_probe, id="mpi"),
    pytest.param("gloo_built", horovodrun.gloo_linked, horovodrun.answer_gloo_probe, id="gloo"),
]


@pytest.mark.parametrize(("probe", "read", "answer"), PROBES)
def test_the_extensions_say_what_horovods_own_probe_says(
    probe: str, read: Callable[[Path | None], bool | None], answer: object
) -> None:
    from horovod.common import util

    linked = read(horovodrun.horovod_dir())
    assert linked is not None, "no framework extension found in the installed horovod"
    assert linked is getattr(util, probe)()
    assert linked, f"hack/install-worker.sh builds Horovod with {probe} here"


@pytest.mark.parametrize(("probe", "read", "answer"), PROBES)
def test_horovodruns_probe_is_answered_from_the_extensions(
    monkeypatch: pytest.MonkeyPatch,
    probe: str,
    read: object,
    answer: Callable[[ModuleType, Path | None], bool],
) -> None:
    from horovod.runner import launch

    monkeypatch.setattr(launch, probe, getattr(launch, probe))  # undone after the test
    assert answer(launch, horovodrun.horovod_dir())
    started = time.monotonic()
    assert getattr(launch, probe)(verbose=True) is True
    assert time.monotonic() - started < 1, "the answer must not import a framework"


def test_the_ssh_check_runs_horovods_own_command() -> None:
    from horovod.runner import launch
    from horovod.runner.util.remote import get_ssh_command

    assert horovodrun.SSH_ATTEMPTS == launch.SSH_ATTEMPTS
    assert horovodrun.SSH_CONNECT_TIMEOUT_S == launch.SSH_CONNECT_TIMEOUT_S
    for port, identity in ((None, None), ("2222", None), ("22", "/keys/id")):
        ours = horovodrun.ssh_command("w-0.w.ns.svc", port, identity)
        theirs = get_ssh_command(
            "true", "w-0.w.ns.svc", port, identity, timeout_s=launch.SSH_CONNECT_TIMEOUT_S
        )
        assert ours == theirs


def test_the_started_checks_take_the_place_of_horovodruns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from horovod.runner import launch
    from horovod.runner.util import cache

    monkeypatch.setattr(
        launch, "_check_all_hosts_ssh_successful", launch._check_all_hosts_ssh_successful
    )
    checks = horovodrun.SshChecks(horovodrun.SshOptions())
    horovodrun.answer_ssh_check(launch, checks, cache.use_cache)
    # Called as _run_static calls it; no host, so nothing runs.
    assert launch._check_all_hosts_ssh_successful([], 2222, None, fn_cache=None) is True
