"""What rank 0's log says: start lines, progress records, stall reports (training_log.py)."""

from __future__ import annotations

from horovod_operator.training_log import read, stamp_key

STAMPED = (
    "2026-12-01T11:03:27.123456789Z Warning: Permanently added host\n"
    "2026-12-01T11:03:31.5Z [1,1]<stdout>:HVJOB_RANK rank=1 size=2 local_rank=0 "
    "local_size=1 hostname=j-worker-1 device=cpu\n"
    "2026-12-01T11:03:31.987654321Z [1,0]<stdout>:HVJOB_RANK rank=0 size=2 local_rank=0 "
    "local_size=1 hostname=j-worker-0 device=cpu\n"
)

# Horovod's stall inspector through mpirun's tags: one LOG(WARNING), several lines.
STALL = (
    "2026-12-01T11:05:00.1Z [1,0]<stderr>:[2026-12-01 11:05:00.100: W "
    "/horovod/common/stall_inspector.cc:107] One or more tensors were submitted to be "
    "reduced, gathered or broadcasted by subset of ranks and are waiting for remainder "
    "of ranks for more than 15 seconds. This may indicate ...\n"
    "2026-12-01T11:05:00.1Z [1,0]<stderr>:Missing ranks:\n"
    "2026-12-01T11:05:00.1Z [1,0]<stderr>:1: [allreduce.fc1.weight, allreduce.fc1.bias]\n"
    "2026-12-01T11:05:00.1Z [1,0]<stderr>:3!: [allreduce.fc1.weight]\n"
    "2026-12-01T11:05:01Z [1,2]<stdout>:something else\n"
)


def test_rank_0s_start_line_is_found_with_the_kubelets_timestamp() -> None:
    reading = read(STAMPED)
    assert reading.rank0_seen and reading.rank0_stamp == "2026-12-01T11:03:31.987654321Z"
    assert reading.sizes == [2, 2]
    assert reading.hosts == {0: "j-worker-0", 1: "j-worker-1"}
    assert reading.last_stamp == "2026-12-01T11:03:31.987654321Z"


def test_without_timestamps_the_line_is_still_found() -> None:
    reading = read("HVJOB_RANK rank=0 size=1 local_rank=0\n")
    assert reading.rank0_seen and reading.rank0_stamp is None and reading.last_stamp is None


def test_a_start_line_run_into_another_ranks_is_found() -> None:
    """mpirun's tags, as kind CI saw them on 2026-12-06: rank 1's line not ended when
    rank 0's came, so both on one line. Rank 0's first step was missed."""
    merged = (
        "2026-12-06T07:13:30.579656576Z [1,1]<stdout>:HVJOB_RANK rank=1 size=2 local_rank=0 "
        "local_size=1 hostname=t-worker-1 device=cpu[1,0]<stdout>:HVJOB_RANK rank=0 size=2 "
        "local_rank=0 local_size=1 hostname=t-worker-0 device=cpu\n"
    )
    reading = read(merged)
    assert reading.rank0_seen and reading.rank0_stamp == "2026-12-06T07:13:30.579656576Z"
    assert reading.hosts == {0: "t-worker-0", 1: "t-worker-1"} and reading.sizes == [2, 2]
    # A host at the end of one rank's line stops before the next rank's tag, and a
    # line without one does not borrow the next rank's.
    ended = read("HVJOB_RANK rank=1 size=2 hostname=w-1[1,0]<stdout>:HVJOB_RANK rank=0 size=2\n")
    assert ended.rank0_seen and ended.hosts == {1: "w-1"}
    bare = read("HVJOB_RANK rank=1 size=2 [1,0]<stdout>:HVJOB_RANK rank=0 size=2 hostname=w-0\n")
    assert bare.rank0_seen and bare.hosts == {0: "w-0"}


def test_other_ranks_and_look_alikes_are_not_rank_0() -> None:
    assert not read("HVJOB_RANK rank=1 size=2\nHVJOB_RANK rank=10 size=12\n").rank0_seen
    assert not read("").rank0_seen


def test_progress_records_in_order_with_their_times() -> None:
    log = (
        '2026-12-01T11:04:00Z [1,0]<stdout>:HVJOB_PROGRESS {"size": 2, "step": 10}\n'
        '2026-12-01T11:04:10.25Z [1,0]<stdout>:HVJOB_PROGRESS {"epoch": 1, "size": 2, '
        '"step": 20, "samplesPerSecond": 64.0}\n'
    )
    reading = read(log)
    assert [(stamp, record["step"]) for stamp, record in reading.records] == [
        ("2026-12-01T11:04:00Z", 10),
        ("2026-12-01T11:04:10.25Z", 20),
    ]
    assert reading.sizes == [2, 2]


def test_the_stall_inspectors_missing_ranks() -> None:
    reading = read(STALL)
    assert reading.missing == [1, 3]
    assert reading.missing_stamp == "2026-12-01T11:05:00.1Z"


def test_lines_up_to_the_previous_readings_last_are_skipped() -> None:
    # sinceTime has whole seconds: the server sends the second's earlier lines again.
    reading = read(STAMPED, after="2026-12-01T11:03:31.5Z")
    assert reading.sizes == [2] and reading.rank0_seen


def test_trimmed_fractions_sort_as_times() -> None:
    assert stamp_key("2026-12-01T11:03:27.1Z") < stamp_key("2026-12-01T11:03:27.12Z")
    assert stamp_key("2026-12-01T11:03:27Z") < stamp_key("2026-12-01T11:03:27.000000001Z")


def test_waiting_ranks_with_their_times() -> None:
    log = (
        '2026-12-01T11:06:00Z [1,0]<stdout>:HVJOB_WAITING {"rank": 0, "step": 40}\n'
        '2026-12-01T11:06:00.5Z [1,2]<stdout>:HVJOB_WAITING {"rank": 2, "step": 40}\n'
    )
    assert read(log).waiting == [("2026-12-01T11:06:00Z", 0), ("2026-12-01T11:06:00.5Z", 2)]
