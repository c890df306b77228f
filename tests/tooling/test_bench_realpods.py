"""The real-pod timings' pure parts: milestones from watch events, steps, the table."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from bench import realpods, realpods_kind


def _pod(name: str, node: str | None = None, ready: bool = False, running: bool = False) -> Any:
    state = {"running": {"startedAt": "x"}} if running else {"waiting": {}}
    return {
        "type": "MODIFIED",
        "object": {
            "metadata": {"name": name},
            "spec": {"nodeName": node} if node else {},
            "status": {
                "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
                "containerStatuses": [{"state": state}],
            },
        },
    }


def test_each_state_is_marked_when_first_seen_and_other_jobs_pods_are_ignored() -> None:
    clock = realpods.PodClock("j", lambda job: job.get("status", {}).get("phase"))
    clock.started -= 1.0  # "now" reads about 1.0 s after the create
    clock.on_pod(_pod("j-worker-0"))
    clock.on_pod(_pod("other-worker-0", node="n", ready=True))
    clock.on_pod(_pod("j-worker-0", node="n"))
    clock.on_pod(_pod("j-worker-0", node="n", ready=True, running=True))
    clock.on_pod(_pod("j-worker-0", node="n", ready=False, running=True))  # not Ready again
    marks = clock.pods["j-worker-0"]
    assert set(marks) == {"created", "scheduled", "ready", "running"}
    assert 1.0 <= marks["created"] <= marks["scheduled"] <= marks["ready"] < 5
    assert "other-worker-0" not in clock.pods
    clock.on_job({"type": "MODIFIED", "object": {"metadata": {"name": "j"}, "status": {}}})
    assert clock.finished is None
    clock.on_job(
        {"type": "MODIFIED", "object": {"metadata": {"name": "j"}, "status": {"phase": "Done"}}}
    )
    assert clock.wait_finished(0.1) == "Done"


def test_a_job_that_never_finishes_times_out_naming_what_was_seen() -> None:
    clock = realpods.PodClock("j", lambda job: None)
    clock.on_pod(_pod("j-worker-0"))
    with pytest.raises(TimeoutError, match="j-worker-0"):
        clock.wait_finished(0.05)


def test_milestones_wait_for_every_worker_and_steps_are_the_gaps() -> None:
    pods = {
        "j-worker-0": {"created": 0.1, "scheduled": 0.3, "ready": 2.0},
        "j-worker-1": {"created": 0.2, "scheduled": 0.4, "ready": 2.5},
        "j-launcher-abcde": {"created": 2.6, "running": 3.0},
    }
    marks = realpods.milestones(pods, "j", 2, finished=20.0, first_step=9.0)
    assert marks == {
        "created": 0.2,
        "scheduled": 0.4,
        "ready": 2.5,
        "launcher": 3.0,
        "first_step": 9.0,
        "finished": 20.0,
    }
    assert realpods.steps(marks) == {
        "created": 0.2,
        "scheduled": 0.2,
        "ready": 2.1,
        "launcher": 0.5,
        "first_step": 6.0,
        "finished": 11.0,
    }
    # A third worker never seen: not "ready" at the second one's time.
    assert realpods.milestones(pods, "j", 3, 20.0, 9.0)["ready"] is None
    assert realpods.steps({**marks, "ready": None})["launcher"] is None


def test_rank_0s_stamp_is_read_from_a_timestamped_log() -> None:
    log = (
        "2026-12-02T19:00:00.100000000Z Warning: Permanently added host\n"
        "2026-12-02T19:00:01.500000000Z [1,1]<stdout>:HVJOB_RANK rank=1 size=2\n"
        "2026-12-02T19:00:02.250000000Z HVJOB_RANK rank=0 size=2 local_rank=0\n"
    )
    expected = datetime.datetime(2026, 12, 2, 19, 0, 2, 250000, tzinfo=datetime.UTC)
    assert realpods.first_step_stamp(log) == expected.timestamp()
    assert realpods.first_step_stamp("HVJOB_RANK rank=0 size=1\n") is None  # no stamp
    assert realpods.first_step_stamp("") is None


def test_the_table_has_medians_per_step_and_the_ratio() -> None:
    def run(created: float, finished: float) -> dict[str, Any]:
        marks = dict.fromkeys(realpods.MILESTONES, 1.0) | {
            "created": created,
            "finished": finished,
        }
        return {"milestones": marks, "steps": realpods.steps(marks)}

    runs = {"ours": [run(0.2, 10.0), run(0.4, 12.0), run(0.3, 11.0)], "theirs": [run(0.5, 20.0)]}
    medians = realpods.summary(runs)
    assert medians["ours"]["milestones.created"] == 0.3
    assert medians["ours"]["milestones.finished"] == 11.0
    text = realpods.table(runs, {"ours": "ours", "theirs": "peer"})
    assert "| step | ours (n=3) | peer (n=1) | ours/theirs |" in text
    assert "| **apply -> finished** | 11.00 s | 20.00 s | 0.55 |" in text
    runs = {"ours": runs["ours"], "converted": [run(0.1, 15.0)], "theirs": runs["theirs"]}
    text = realpods.table(runs, {"theirs": "peer"})
    assert (
        "| step | ours (n=3) | converted (n=1) | peer (n=1) | ours/theirs | converted/theirs |"
        in text
    )
    assert "| **apply -> finished** | 11.00 s | 15.00 s | 20.00 s | 0.55 | 0.75 |" in text


def test_the_launcher_timeline_stops_at_rank_0s_first_step() -> None:
    since = datetime.datetime(2026, 12, 2, 19, 0, 0, tzinfo=datetime.UTC).timestamp()
    log = (
        "2026-12-02T19:00:00.500000000Z horovod_worker.sshd: ssh client configured\n"
        "2026-12-02T19:00:01.000000000Z [launcher:12] Warning: " + "x" * 300 + "\n"
        "2026-12-02T19:00:03.250000000Z [1,0]<stdout>:HVJOB_RANK rank=0 size=2\n"
        "2026-12-02T19:00:04.000000000Z [1,0]<stdout>:epoch 1\n"
    )
    timeline = realpods.log_timeline(log, since)
    assert [at for at, _ in timeline] == [0.5, 1.0, 3.25]
    assert timeline[0][1] == "horovod_worker.sshd: ssh client configured"
    assert len(timeline[1][1]) == realpods.TIMELINE_WIDTH
    assert realpods.log_timeline("no stamp\n", since) == [[None, "no stamp"]]


def test_the_kind_shapes_run_one_program_from_one_image() -> None:
    """On kind both operators run the digits trainer from the same worker image; the
    MPIJob keeps its users' shape (mpirun as root, the image's `sshd -De`) and gets
    what mpi-operator's images bake in, not a wrapper of ours."""
    image = "horovod-worker:0.1.0-torch-cpu"
    ours = realpods_kind.horovod_job("hv-0", image)
    assert ours["spec"]["image"] == image and ours["spec"]["command"] == realpods_kind.PROGRAM
    assert ours["spec"]["worker"]["replicas"] == realpods_kind.WORKERS
    # The preloaded shape: the same job, HVJOB_PRELOAD on both roles' containers.
    preloaded = realpods_kind.preloaded_job("hvp-0", image)
    assert preloaded["spec"]["worker"]["replicas"] == realpods_kind.WORKERS
    for role in ("worker", "launcher"):
        (container,) = preloaded["spec"][role]["template"]["spec"]["containers"]
        assert container["name"] == role
        assert container["env"] == [{"name": "HVJOB_PRELOAD", "value": "torch,horovod.torch"}]

    mpi = realpods_kind.mpi_job("mpi-0", image)
    spec = mpi["spec"]
    assert spec["launcherCreationPolicy"] == "WaitForWorkersReady"
    launcher = spec["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]
    worker = spec["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
    args = launcher["containers"][0]["args"]
    assert launcher["containers"][0]["command"] == ["mpirun"] and "--allow-run-as-root" in args
    assert args[-len(realpods_kind.PROGRAM) :] == realpods_kind.PROGRAM
    (script,) = worker["containers"][0]["args"]
    assert script.startswith("mkdir -p /run/sshd && exec /usr/sbin/sshd -De ")
    assert "horovod_worker" not in script
    for pod in (launcher, worker):
        assert pod["securityContext"]["runAsUser"] == 0
        assert pod["containers"][0]["image"] == image
        assert "resources" not in pod["containers"][0]
    mounts = {m["mountPath"] for m in launcher["containers"][0]["volumeMounts"]}
    assert mounts == {"/etc/ssh/ssh_config.d"}
    assert worker["volumes"][0]["secret"]["defaultMode"] == 0o600
