"""horovod_worker.horovodrun against the Horovod built here: the same answers as
horovodrun's own probe, without the probe's framework imports."""

from __future__ import annotations

import time

import pytest

from horovod_worker import horovodrun


def test_the_extensions_say_what_horovods_own_probe_says() -> None:
    from horovod.common.util import mpi_built

    linked = horovodrun.mpi_linked(horovodrun.horovod_dir())
    assert linked is not None, "no framework extension found in the installed horovod"
    assert linked is mpi_built()
    assert linked, "hack/install-worker.sh builds Horovod with MPI here"


def test_horovodruns_probe_is_answered_from_the_extensions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from horovod.runner import launch

    monkeypatch.setattr(launch, "mpi_built", launch.mpi_built)  # undone after the test
    assert horovodrun.answer_mpi_probe(launch, horovodrun.horovod_dir())
    started = time.monotonic()
    assert launch.mpi_built(verbose=True) is True
    assert time.monotonic() - started < 1, "the answer must not import a framework"
