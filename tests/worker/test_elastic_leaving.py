"""A rank told to leave an elastic job leaves, even when the driver dropped its host
first (preemption.commit_or_leave): the race CI met, in which the leaving rank's
commit raised HostsUpdatedInterrupt and its reset ended it with std::terminate."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

from horovod_worker.preemption import (
    Departed,
    Preempted,
    StopOnSignal,
    commit_or_leave,
    elastic_look,
)


class HostsUpdated(RuntimeError):
    """Stands in for horovod.common.exceptions.HostsUpdatedInterrupt (a RuntimeError)."""


@pytest.fixture
def stop() -> Iterator[StopOnSignal]:
    previous = signal.getsignal(signal.SIGTERM)
    try:
        yield StopOnSignal(every=5)
    finally:
        signal.signal(signal.SIGTERM, previous)


def hosts_updated() -> None:
    raise HostsUpdated("hosts changed")


def test_a_commit_on_a_rank_not_told_to_go_raises_what_horovod_raised(
    stop: StopOnSignal,
) -> None:
    said: list[str] = []
    with pytest.raises(HostsUpdated):
        commit_or_leave(hosts_updated, stop, 40, said.append)
    assert said == []


def test_a_rank_told_to_go_leaves_when_its_commit_meets_a_host_update(
    stop: StopOnSignal,
) -> None:
    said: list[str] = []
    stop.requested = True
    with pytest.raises(Departed, match="left at step 40"):
        commit_or_leave(hosts_updated, stop, 40, said.append)
    assert said == ["SIGTERM: leaving at step 40; the others go on"]


def test_a_commit_that_passes_changes_nothing(stop: StopOnSignal) -> None:
    commits: list[int] = []
    commit_or_leave(lambda: commits.append(1), stop, 10, lambda _m: None)
    assert commits == [1]


def test_the_look_makes_the_leaving_rank_go_and_the_others_reset(stop: StopOnSignal) -> None:
    """One rank of three got SIGTERM and the driver's update is already there: that
    rank leaves with 143 (Departed); a rank without the flag gets the update and
    resets as Horovod wants."""

    def look() -> None:
        elastic_look(
            stop,
            lambda _value, _name: 1.0,  # the sum over the ranks: one got SIGTERM
            3,
            15,
            lambda: "not asked for",
            hosts_updated,
            lambda _m: None,
        )

    with pytest.raises(HostsUpdated):
        look()
    stop.requested = True
    with pytest.raises(Departed):
        look()


def test_every_rank_told_to_go_stops_at_a_checkpoint_instead(stop: StopOnSignal) -> None:
    stop.requested = True
    with pytest.raises(Preempted, match="every rank got SIGTERM at step 15; saved") as caught:
        elastic_look(stop, lambda _v, _n: 3.0, 3, 15, lambda: "saved", hosts_updated, print)
    assert not isinstance(caught.value, Departed)
