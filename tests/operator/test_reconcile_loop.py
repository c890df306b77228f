"""The reconcile loop over a recording fake of the kube layer: order of writes,
409s read and never adopted, 403s retried with backoff, conflicts on status.

The behaviour against the real API server is in tests/operator/integration; this checks
the executor's bookkeeping quickly and exactly.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Mapping
from typing import Any

import pytest

from horovod_operator import executor, sshkeys
from horovod_operator.kube_errors import KubeError
from horovod_operator.memory import Index, Indexes, JobMemory
from horovod_operator.plan import Delete
from horovod_operator.reconciler import MAX_WINDOW, TRIGGER_CHUNK, Reconciler, retry_delay
from horovod_operator.sshkeys import generate_key_pair
from horovod_operator.status_writing import StaleView
from horovod_operator.views import slim_launcher_job
from tests.support.aio import wait_for

KEY = ("ns", "j")
JOB: dict[str, Any] = {
    "apiVersion": "horovod.ai/v1alpha1",
    "kind": "HorovodJob",
    "metadata": {
        "name": "j",
        "namespace": "ns",
        "uid": "u-1",
        "generation": 1,
        "resourceVersion": "1",
    },
    # No gang wanted: this fake serves no API, and its Events here are the refusals'.
    "spec": {
        "image": "img",
        "command": ["c"],
        "worker": {"replicas": 2},
        "scheduling": {"gang": {"policy": "None"}},
    },
}


class FakeKube:
    """Records every call; answers creates from `refuse` and `existing`."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str]] = []
        self.refuse: dict[str, KubeError] = {}
        self.existing: dict[str, dict[str, Any]] = {}
        self.created: dict[str, dict[str, Any]] = {}  # what a GET finds
        self.status_conflict = False
        self.events: list[tuple[str, str]] = []

    async def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        name = obj["metadata"]["name"]
        self.calls.append(("create", obj["kind"], name))
        if name in self.refuse:
            raise self.refuse[name]
        if name in self.existing:
            raise KubeError(409, "AlreadyExists", f"{name} already exists")
        self.created[name] = obj
        return obj

    async def get(
        self, kind: str, namespace: str, name: str, api_version: str = ""
    ) -> dict[str, Any] | None:
        self.calls.append(("get", kind, name))
        return self.existing.get(name) or self.created.get(name)

    async def delete(self, kind: str, namespace: str, name: str, *_: Any) -> None:
        self.calls.append(("delete", kind, name))
        self.created.pop(name, None)

    async def merge_patch(self, kind: str, namespace: str, name: str, patch: Any) -> Any:
        self.calls.append(("patch", kind, name))
        return {}

    async def patch_job_status(
        self, namespace: str, name: str, resource_version: str | None, status: Any
    ) -> dict[str, Any]:
        self.calls.append(("status", "HorovodJob", name))
        if self.status_conflict:
            raise KubeError(409, "Conflict", "the object has been modified")
        body = copy.deepcopy(JOB)
        body["status"] = {k: v for k, v in status.items() if v is not None}
        body["metadata"]["resourceVersion"] = str(int(resource_version or "1") + 1)
        return body

    async def get_job(self, namespace: str, name: str) -> dict[str, Any]:
        self.calls.append(("get", "HorovodJob", name))
        return copy.deepcopy(JOB)

    async def delete_job(self, namespace: str, name: str, uid: str) -> None:
        self.calls.append(("delete", "HorovodJob", name))

    async def post_event(self, job: Mapping[str, Any], type_: str, reason: str, *_: Any) -> None:
        self.events.append((type_, reason))

    async def list_events(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        return []


def reconciler(kube: FakeKube) -> Reconciler:
    loop = Reconciler(kube)  # type: ignore[arg-type]
    loop.executor.indexes = loop_indexes()
    return loop


def writes(kube: FakeKube) -> list[tuple[str, str, str]]:
    return [c for c in kube.calls if c[0] != "get"]


def test_the_first_write_is_the_status_then_the_children_in_order() -> None:
    kube = FakeKube()
    asyncio.run(reconciler(kube).reconcile(KEY))
    assert writes(kube) == [
        ("status", "HorovodJob", "j"),
        ("create", "Secret", "j-ssh"),
        ("create", "ConfigMap", "j-config"),
        ("create", "Service", "j-worker"),
        ("create", "Pod", "j-worker-0"),
        ("create", "Pod", "j-worker-1"),
    ]


def test_a_taken_name_is_read_reported_and_never_adopted() -> None:
    kube = FakeKube()
    kube.existing["j-worker-0"] = {
        "kind": "Pod",
        "metadata": {
            "name": "j-worker-0",
            "ownerReferences": [
                {"controller": True, "kind": "ReplicaSet", "name": "rs", "uid": "x"}
            ],
        },
    }
    loop = reconciler(kube)

    async def twice() -> None:
        await loop.reconcile(KEY)
        await loop.reconcile(KEY)

    asyncio.run(twice())
    assert ("get", "Pod", "j-worker-0") in kube.calls
    assert not [c for c in kube.calls if c[0] in ("patch", "delete")]
    memory = loop.executor.memory[KEY]
    assert memory.patched is not None
    stalled = next(c for c in memory.patched["status"]["conditions"] if c["type"] == "Stalled")
    assert stalled["reason"] == "ChildConflict"
    assert "controlled by ReplicaSet rs (uid x), not by this job" in stalled["message"]
    assert ("Warning", "ChildConflict") in kube.events
    # Within its backoff the refused create is not sent again.
    assert kube.calls.count(("create", "Pod", "j-worker-0")) == 1


@pytest.mark.parametrize(
    ("code", "reason"),
    [(403, "CreateForbidden"), (429, "CreateThrottled"), (500, "CreateFailed")],
)
def test_a_refused_create_is_retried_only_after_its_backoff(code: int, reason: str) -> None:
    kube = FakeKube()
    kube.refuse["j-worker-1"] = KubeError(code, "Refused", "exceeded quota: q")
    loop = reconciler(kube)

    async def run() -> float | None:
        first = await loop.reconcile(KEY)
        assert first is not None and 0 < first <= 1.0
        await loop.reconcile(KEY)  # at once: the create waits for its backoff
        return await loop.reconcile(KEY)

    asyncio.run(run())
    assert kube.calls.count(("create", "Pod", "j-worker-1")) == 1
    assert kube.events == [("Warning", reason)]


def test_a_permanent_refusal_fails_the_job_and_removes_what_was_created() -> None:
    kube = FakeKube()
    kube.refuse["j-worker-1"] = KubeError(422, "Invalid", "spec.containers[0].name: Invalid value")
    loop = reconciler(kube)

    async def run() -> None:
        await loop.reconcile(KEY)
        # The watch now shows what was created.
        owner = [{"controller": True, "kind": "HorovodJob", "name": "j", "uid": "u-1"}]
        pod = {
            "kind": "Pod",
            "metadata": {
                "name": "j-worker-0",
                "ownerReferences": owner,
                "labels": {"horovod.ai/role": "worker", "horovod.ai/attempt": "0"},
            },
        }
        # The Secret is not watched: the executor knows it from its own create.
        watched = loop.executor.indexes.by_kind
        loop.executor.indexes = Indexes({**watched, "Pod": {KEY: [pod]}})
        await loop.reconcile(KEY)

    asyncio.run(run())
    assert ("delete", "Pod", "j-worker-0") in kube.calls
    assert ("delete", "Secret", "j-ssh") in kube.calls
    assert kube.events == [("Warning", "InvalidSpec")]


def test_a_status_conflict_stops_the_reconcile_and_rereads_the_job() -> None:
    kube = FakeKube()
    kube.status_conflict = True
    loop = reconciler(kube)

    async def run() -> None:
        try:
            await loop.reconcile(KEY)
        except StaleView:
            return
        raise AssertionError("a conflict must raise StaleView")

    asyncio.run(run())
    assert writes(kube) == [("status", "HorovodJob", "j")]  # nothing created on a stale view
    assert ("get", "HorovodJob", "j") in kube.calls


def test_retry_delay_is_capped_and_never_overflows() -> None:
    assert [retry_delay(n) for n in (1, 2, 3)] == [1.0, 2.0, 4.0]
    assert retry_delay(10_000) == 60.0


def test_healthz_turns_red_while_a_reconcile_hangs() -> None:
    import urllib.error
    import urllib.request

    from horovod_operator.metrics import HealthServer

    kube = FakeKube()
    hang = asyncio.Event()

    async def never_answers(obj: dict[str, Any]) -> dict[str, Any]:
        await hang.wait()
        return obj

    kube.create = never_answers  # type: ignore[method-assign]
    loop = reconciler(kube)

    def probe(port: int) -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
                return int(r.status)
        except urllib.error.HTTPError as error:
            return int(error.code)

    async def run() -> list[int]:
        import socket

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        health = HealthServer(port, stalled=lambda: loop.stalled_for() > 0.3)
        await health.start()
        codes = [await asyncio.to_thread(probe, port)]
        loop.batch_window = 0
        loop.trigger(KEY)
        # The create hangs past the stall threshold, then answers.
        codes.append(await wait_for(lambda: (c := probe(port)) != 200 and c, 5, "a red probe"))
        hang.set()
        codes.append(await wait_for(lambda: (c := probe(port)) != 500 and c, 5, "a green probe"))
        await loop.shutdown()
        await health.stop()
        return codes

    assert asyncio.run(run()) == [200, 500, 200]


def test_a_standby_replica_reconciles_nothing_until_it_leads() -> None:
    kube, twin_kube = FakeKube(), FakeKube()
    loop, twin = reconciler(kube), reconciler(twin_kube)
    loop.active = False
    first_write = ("status", "HorovodJob", "j")

    async def run() -> None:
        loop.batch_window = twin.batch_window = 0
        loop.trigger(KEY)
        twin.trigger(KEY)  # an active replica, told the same at the same moment
        await wait_for(lambda: first_write in twin_kube.calls, 5, "the active twin's write")
        assert kube.calls == []
        # A standby keeps no work per job, however many it hears of.
        for i in range(10_000):
            loop.trigger(("ns", f"job-{i}"))
        assert loop.pending() == 0
        loop.activate()
        await wait_for(lambda: first_write in kube.calls, 5, "the new leader's write")
        await loop.shutdown()
        await twin.shutdown()

    asyncio.run(run())


def test_a_takeover_triggers_its_jobs_a_chunk_per_loop_iteration() -> None:
    """All at once, every job's reconcile was ready together and asyncio ran them all
    before any timer: 10,000 jobs blocked the loop 0.8 s (bench/takeover.py)."""
    kube = FakeKube()
    loop = reconciler(kube)
    loop.active = False
    finished = copy.deepcopy(JOB)
    finished["status"] = {"phase": "Succeeded", "restarts": 0}
    count = 5 * TRIGGER_CHUNK
    loop.executor.indexes = loop_indexes(
        jobs={("ns", f"job-{i}"): [finished] for i in range(count)}
    )
    passes: list[tuple[str, str]] = []
    reconcile = loop.reconcile

    async def counted(key: tuple[str, str]) -> float | None:
        passes.append(key)
        return await reconcile(key)

    loop.reconcile = counted  # type: ignore[method-assign]

    async def run() -> None:
        loop.activate()
        started: list[int] = []
        for _ in range(3):
            await asyncio.sleep(0)
            started.append(len(loop._tasks) + len(passes))
        assert started[0] <= TRIGGER_CHUNK < count, started
        assert started[2] <= 3 * TRIGGER_CHUNK, started
        await wait_for(lambda: len(passes) >= count or None, 10, "every job reconciled")
        await loop.shutdown()

    asyncio.run(run())
    assert sorted(passes) == sorted(("ns", f"job-{i}") for i in range(count))


def test_leadership_and_the_first_listing_in_one_tick_lose_no_job() -> None:
    """Seen in CI: the chart's operator became the leader in the same loop iteration
    as its watches finished listing; the second spread of triggers cancelled the
    first before it ran, and a job that existed before the start was never
    reconciled (no status in 60 s)."""
    kube = FakeKube()
    loop = reconciler(kube)
    loop.active = False
    loop.synced = False
    loop.batch_window = 0
    first_write = ("status", "HorovodJob", "j")

    async def run() -> None:
        loop.trigger(KEY)  # heard while a standby: kept nowhere (the index has it)
        loop.activate()
        loop.mark_synced()
        await wait_for(lambda: first_write in kube.calls, 5, "the job's first write")
        await loop.shutdown()

    asyncio.run(run())


def test_a_finished_job_without_its_secret_generates_no_keys(monkeypatch: Any) -> None:
    """At start-up every finished job is reconciled once; fresh key pairs for a
    Secret it will never create were most of that reconcile's CPU."""
    made: list[str] = []

    def counting(comment: str = "horovod-operator") -> Any:
        made.append(comment)
        return generate_key_pair(comment)

    monkeypatch.setattr(sshkeys, "generate_key_pair", counting)
    kube = FakeKube()
    loop = reconciler(kube)
    finished = copy.deepcopy(JOB)
    finished["status"] = {"phase": "Succeeded", "restarts": 0}
    loop.executor.indexes = loop_indexes(jobs={KEY: [finished]})
    asyncio.run(loop.reconcile(KEY))
    assert made == []
    assert not [c for c in writes(kube) if c[0] == "create"]
    # A job that is not finished still gets its keys.
    loop.executor.indexes = loop_indexes()
    asyncio.run(loop.reconcile(KEY))
    assert made == ["horovod-operator", "horovod-job-host"]


def loop_indexes(jobs: Index | None = None) -> Indexes:
    return Indexes({"HorovodJob": jobs if jobs is not None else {KEY: [JOB]}})


def timed_passes(loop: Reconciler) -> list[float]:
    """When each reconcile of `loop` starts (the event loop's clock), as it runs."""
    passes: list[float] = []
    reconcile = loop.reconcile

    async def counted(key: tuple[str, str]) -> float | None:
        passes.append(asyncio.get_running_loop().time())
        return await reconcile(key)

    loop.reconcile = counted  # type: ignore[method-assign]
    return passes


def test_a_job_is_reconciled_at_once_then_at_most_once_per_window() -> None:
    kube = FakeKube()
    loop = reconciler(kube)
    loop.batch_window = 0.5
    passes = timed_passes(loop)

    async def run() -> None:
        start = asyncio.get_running_loop().time()
        loop.trigger(KEY)
        loop.trigger(KEY)  # in the same tick: folded into the first pass
        await wait_for(lambda: passes or None, 5, "no first pass")
        assert passes[0] - start < 0.2  # not held for the window
        for _ in range(5):  # a burst of events during and after the pass
            loop.trigger(KEY)
            await asyncio.sleep(0.02)
        await wait_for(lambda: len(passes) >= 2 or None, 5, "no second pass")
        assert passes[1] - passes[0] >= 0.45  # the window, folding the burst
        await asyncio.sleep(0.7)
        assert len(passes) == 2
        await loop.shutdown()

    asyncio.run(run())


def test_a_hurried_job_skips_the_window_and_the_workers_events_still_fold() -> None:
    """The launcher's changes (Watches' on_urgent) end a window being waited out, and
    one that comes while a pass runs makes the next pass start at once; events
    without it still wait for the window."""
    kube = FakeKube()
    loop = reconciler(kube)
    loop.batch_window = 2.0
    passes = timed_passes(loop)

    async def run() -> None:
        clock = asyncio.get_running_loop().time
        loop.trigger(KEY)
        await wait_for(lambda: passes or None, 5, "no first pass")
        await wait_for(lambda: not loop._started or None, 5, "the first pass did not end")
        for _ in range(3):  # the workers' events: they wait for the window
            loop.trigger(KEY)
            await asyncio.sleep(0.05)
        assert len(passes) == 1
        hurried = clock()
        loop.trigger(KEY)
        loop.hurry(KEY)  # the launcher's pod: the window's wait ends now
        await wait_for(lambda: len(passes) >= 2 or None, 5, "no hurried pass")
        assert passes[1] - hurried < 0.5 < 2.0
        await wait_for(lambda: not loop._started or None, 5, "the second pass did not end")
        # Urgent before any wait (no task waiting): the next pass starts at once too.
        loop.hurry(KEY)
        loop.trigger(KEY)
        await wait_for(lambda: len(passes) >= 3 or None, 5, "no third pass")
        assert passes[2] - passes[1] < 1.0
        await asyncio.sleep(0.1)
        assert len(passes) == 3
        await loop.shutdown()

    asyncio.run(run())


def test_the_window_grows_with_the_pods_still_to_start_up_to_its_cap() -> None:
    loop = reconciler(FakeKube())
    loop.batch_window = 0.05
    ready = {"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}
    pending = {"status": {"phase": "Pending"}}
    done = {"status": {"phase": "Succeeded"}}

    def window(replicas: int, pods: list[dict[str, Any]]) -> float:
        job = {**JOB, "spec": {**JOB["spec"], "worker": {"replicas": replicas}}}
        loop.executor.indexes = Indexes({"HorovodJob": {KEY: [job]}, "Pod": {KEY: pods}})
        return loop.window(KEY)

    assert window(8, []) == window(63, [pending] * 63) == 0.05
    # A 512-worker job: the pods not created yet count, as do those not Ready.
    assert window(511, []) == pytest.approx(0.4)
    assert window(511, [ready] * 384 + [pending] * 64) == pytest.approx(0.1)
    # Nearly every worker Ready: a small job's window, for the pass that creates the
    # launcher; and while the job runs (or has finished) the same.
    assert window(511, [ready] * 500) == 0.05
    assert window(511, [ready] * 512) == window(511, [done] * 512) == 0.05
    assert window(4095, []) == MAX_WINDOW
    assert loop.window(("ns", "other")) == 0.05  # a job not seen (yet, or any more)
    assert window(511, [{}] * 64 + [{"status": None}]) == pytest.approx(0.4)  # thin views
    loop.batch_window = 0
    assert window(4095, []) == 0  # no window (the tests' loops): none at any size
    loop.batch_window = 2.0
    assert window(8, []) == window(4095, []) == 2.0  # a window above the cap stays


def test_a_standby_ignores_hurry() -> None:
    loop = reconciler(FakeKube())
    loop.active = False
    loop.hurry(KEY)
    assert loop._urgent == set()


def test_a_delete_that_failed_is_sent_again_at_the_next_reconcile() -> None:
    """A DELETE that fails (a 500, a timeout) is not "in flight": the reconcile fails
    and its retry sends it again, instead of waiting out the 30 s a pending delete
    is remembered for."""
    sent: list[str] = []

    class Failing:
        async def delete(self, kind: str, namespace: str, name: str, *_: Any) -> None:
            sent.append(name)
            if name == "j-worker-1" and sent.count(name) == 1:
                raise KubeError(500, "InternalError", "etcdserver: request timed out")

    ex = executor.Executor(Failing()).applier  # type: ignore[arg-type]
    memory = JobMemory(uid="u")
    deletes = [Delete("Pod", "j-worker-0", uid="a"), Delete("Pod", "j-worker-1", uid="b")]

    async def run() -> None:
        with pytest.raises(KubeError, match="500"):
            await ex._delete(("ns", "j"), deletes, memory)
        assert "j-worker-1" not in memory.deleting and "j-worker-0" in memory.deleting
        await ex._delete(("ns", "j"), deletes, memory)

    asyncio.run(run())
    assert sent == ["j-worker-0", "j-worker-1", "j-worker-1"]


def test_a_builder_bug_is_logged_with_its_traceback_and_retried_not_blamed_on_the_spec(
    monkeypatch: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A builder that raises is our bug: the job stays as it was (no InvalidSpec, no
    write at all), the log has the traceback, and the job is tried again later."""
    from horovod_operator import builders

    def broken(*_: Any, **__: Any) -> dict[str, Any]:
        raise TypeError("a bug of ours")

    monkeypatch.setattr(builders, "new_worker_pod", broken)
    kube = FakeKube()
    loop = reconciler(kube)

    async def run() -> None:
        loop.batch_window = 0
        loop.trigger(KEY)
        await wait_for(lambda: loop._errors.get(KEY), 5, "a failed pass")
        await loop.shutdown()

    with caplog.at_level(logging.WARNING, "horovod_operator.reconciler"):
        asyncio.run(run())
    failed = [r for r in caplog.records if "reconcile of ns/j failed" in r.getMessage()]
    assert failed and failed[0].exc_info is not None, caplog.text
    assert failed[0].exc_info[0] is TypeError
    assert writes(kube) == []


def launcher_objects(job_uid: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The launcher Job as its create answered, and the pod the Job controller made."""
    labels = {
        "horovod.ai/role": "launcher",
        "horovod.ai/attempt": "0",
        "horovod.ai/job-uid": job_uid,
    }
    batch_job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": "j-launcher",
            "namespace": "ns",
            "uid": "launcher-uid",
            "labels": labels,
            "ownerReferences": [{"kind": "HorovodJob", "uid": job_uid, "controller": True}],
        },
        "spec": {},
    }
    pod = {
        "kind": "Pod",
        "metadata": {
            "name": "j-launcher-x7k2p",
            "namespace": "ns",
            "labels": labels,
            "ownerReferences": [{"kind": "Job", "uid": "launcher-uid", "controller": True}],
        },
        "spec": {},
        "status": {"phase": "Pending"},
    }
    return batch_job, pod


def test_a_launcher_pod_whose_job_the_watch_lags_on_is_not_stray() -> None:
    """The Job watch can lag behind the Pod watch (CI, 2026-12-06, load 18: a job
    restarted for LauncherDeleted before it ran). The Job as its create answered
    stands in until the watch shows it."""
    kube = FakeKube()
    loop = reconciler(kube)
    observer = loop.executor.observer
    batch_job, pod = launcher_objects("u-1")
    watched = dict(loop.executor.indexes.by_kind)
    observer.indexes = Indexes({**watched, "Pod": {KEY: [pod]}, "Job": {KEY: []}})

    def look() -> tuple[Any, JobMemory]:
        found = asyncio.run(observer.observe(KEY, 0.0))
        assert found is not None
        return found

    seen, memory = look()
    assert seen.children.stray_launcher_pods == [pod]  # what the lag looked like
    # The create's answer is kept (the fake answers with what was sent), as the
    # watch would keep it.
    assert asyncio.run(loop.executor.applier._create_one(memory, batch_job, 1))
    kept = slim_launcher_job(batch_job)
    assert memory.launcher == kept and "j-launcher" in memory.creating
    seen, memory = look()
    assert seen.children.launcher_job == kept
    assert seen.children.launcher_pods == [pod] and seen.children.stray_launcher_pods == []
    assert "j-launcher" in memory.creating  # not seen by the watch yet: still expected
    # Deleted before the watch showed it (a restart at once): no stand-in is left to
    # hold the next attempt back.
    asyncio.run(loop.executor.applier._delete(KEY, [Delete("Job", "j-launcher")], memory))
    assert memory.launcher is None
    memory.launcher = batch_job
    # The watch shows it: the stand-in goes, and so does the expectation.
    observer.indexes = Indexes({**watched, "Pod": {KEY: [pod]}, "Job": {KEY: [batch_job]}})
    seen, memory = look()
    assert memory.launcher is None and "j-launcher" not in memory.creating
    assert seen.children.launcher_pods == [pod]
