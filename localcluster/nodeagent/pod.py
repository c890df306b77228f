"""One pod, from binding to deletion: what a kubelet's pod worker does, in one thread.

The runner sets up the pod's sandbox (network namespace, /etc files, volumes,
environments), starts its init containers one after another and then its
containers, restarts them by the restart policy, probes them, reports the
pod's status, and stops everything when the pod is deleted. What it needs from
the agent is a PodHost (podhost.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import horovod_contract as contract

from . import netns, probes, spec
from .kube import ApiError
from .mounts import container_mounts, reachable_mounts, write_etc
from .podhost import PodHost
from .probes import Probe
from .spec import HOME, NODE_IP, ContainerState, Obj
from .status import StatusReporter
from .volumes import write_volumes

log = logging.getLogger("nodeagent.pod")

PODINIT = Path(__file__).resolve().parent / "podinit.py"
TICK = 0.2
# Restart back-off: the kubelet's starts at 10s and doubles to 5 minutes; a local
# test run wants failures retried sooner.
BACKOFF_START, BACKOFF_MAX = 1.0, 20.0
# How long a pod may wait for a missing Secret/ConfigMap before it fails.
VOLUME_RETRY_SECONDS = 120


class PodGone(Exception):
    """The pod left the API server (or the agent is stopping): stop at once."""


@dataclass
class Container:
    spec: Obj
    state: ContainerState
    init: bool = False
    proc: subprocess.Popen[bytes] | None = None
    env: dict[str, str] = field(default_factory=dict)
    startup: Probe | None = None
    readiness: Probe | None = None
    liveness: Probe | None = None
    restart_at: float | None = None
    backoff: float = BACKOFF_START


class PodRunner(threading.Thread):
    def __init__(self, host: PodHost, pod: Obj):
        meta = pod["metadata"]
        super().__init__(name=f"pod-{meta['namespace']}/{meta['name']}", daemon=True)
        self.host = host
        self.pod = pod
        self.uid: str = meta["uid"]
        self.namespace: str = meta["namespace"]
        self.pod_name: str = meta["name"]
        self.node: str = pod["spec"]["nodeName"]
        self.restart_policy: str = pod["spec"].get("restartPolicy", "Always")
        self.dir: Path = host.pods_dir / self.uid
        self.log_dir = host.logs_dir / f"{self.namespace}_{self.pod_name}_{self.uid}"
        self._lock = threading.Lock()
        self._gone = threading.Event()
        # Set by gone() and by each finished probe run: the runner looks at once.
        self._wake = threading.Event()
        self.netns: str | None = None
        self.ip = ""
        self.gpus: list[int] = []
        self._status = StatusReporter(host.kube, self.namespace, self.pod_name, self.host_ip)
        self.init_done = False
        self.init_failed = False
        self.finished = threading.Event()
        self.containers = [
            self._container(c, init=True) for c in pod["spec"].get("initContainers") or []
        ] + [self._container(c, init=False) for c in pod["spec"]["containers"]]

    # ------------------------------------------------------------ called by the agent

    def update(self, pod: Obj) -> None:
        with self._lock:
            self.pod = pod

    def gone(self) -> None:
        """The pod was removed from the API server (force delete or our own final delete)."""
        self._gone.set()
        self._wake.set()

    def container_running(self, name: str) -> bool:
        return any(c.spec["name"] == name and c.proc is not None for c in self.containers)

    def reported_phase(self) -> str | None:
        """The phase the API server last accepted from this runner."""
        sent = self._status.sent
        return str(sent["phase"]) if sent else None

    def deletion_grace(self) -> float | None:
        with self._lock:
            meta = self.pod["metadata"]
        if not meta.get("deletionTimestamp"):
            return None
        return float(meta.get("deletionGracePeriodSeconds") or 0)

    def status(self) -> Obj:
        """The pod's status now (conditions remember when they changed)."""
        return self._status.build(
            restart_policy=self.restart_policy,
            init_done=self.init_done,
            init_failed=self.init_failed,
            inits=[c.state for c in self.containers if c.init],
            mains=[c.state for c in self.containers if not c.init],
            pod_ip=self.ip,
        )

    def fail(self, reason: str, message: str) -> None:
        """Report the pod Failed with `reason` and `message` (raises when that fails)."""
        self._status.send_failed(self.status(), reason, message)

    # ------------------------------------------------------------ the pod's life

    def run(self) -> None:
        try:
            self._run()
        except PodGone:
            log.info("%s/%s: stopped", self.namespace, self.pod_name)
        except Exception:
            log.exception("%s/%s: pod worker failed", self.namespace, self.pod_name)
            with contextlib.suppress(Exception):
                self.fail("NodeAgentError", "the node agent failed; see its log")
        finally:
            self._teardown()
            self.finished.set()

    def _run(self) -> None:
        self._report()  # Pending, with start time and host IP
        self._sandbox()
        self._report()
        inits = [c for c in self.containers if c.init]
        mains = [c for c in self.containers if not c.init]
        for container in inits:
            if not self._run_init(container):
                self.init_failed = True
                self._report()
                return
        self.init_done = True
        for container in mains:
            self._start(container)
        self._report()
        while True:
            grace = self.deletion_grace()
            if grace is not None:
                self._stop(grace)
                self._final_delete()
                return
            self._tick(mains)
            phase = self._report()
            if phase in ("Succeeded", "Failed") and self._status.sent is not None:
                log.info("%s/%s: %s", self.namespace, self.pod_name, phase)
                return
            self._sleep(TICK)

    def _sleep(self, seconds: float) -> None:
        self._wake.wait(seconds)
        self._wake.clear()
        if self._gone.is_set() or self.host.stopping.is_set():
            raise PodGone

    def _run_init(self, container: Container) -> bool:
        """Run one init container to completion; retried unless restartPolicy is Never."""
        while True:
            self._start(container)
            self._report()
            while container.proc is not None and container.proc.poll() is None:
                grace = self.deletion_grace()
                if grace is not None:
                    self._stop(grace)
                    self._final_delete()
                    raise PodGone
                self._sleep(TICK)
            if container.proc is not None:
                self._reap(container)
            if container.state.exit_code == 0:
                self._report()
                return True
            if self.restart_policy == "Never":
                return False
            state = container.state
            state.last_terminated = state.terminated()
            state.state, state.reason = "waiting", "CrashLoopBackOff"
            self._report()
            self._sleep(container.backoff)
            container.backoff = min(container.backoff * 2, BACKOFF_MAX)
            state.restart_count += 1

    def _tick(self, mains: list[Container]) -> None:
        now = time.monotonic()
        for c in mains:
            if c.proc is not None and c.proc.poll() is not None:
                self._reap(c)
                code = c.state.exit_code
                again = self.restart_policy == "Always" or (
                    self.restart_policy == "OnFailure" and code != 0
                )
                if again:
                    c.restart_at = now + c.backoff
                    c.backoff = min(c.backoff * 2, BACKOFF_MAX)
            elif c.proc is None and c.restart_at is not None and now >= c.restart_at:
                c.restart_at = None
                c.state.restart_count += 1
                self._start(c)
            elif c.proc is not None:
                self._probe(c, now)
        # A failed container waiting for its restart shows CrashLoopBackOff.
        for c in mains:
            if c.restart_at is not None and c.state.state == "terminated":
                c.state.last_terminated = c.state.terminated()
                c.state.state, c.state.reason = "waiting", "CrashLoopBackOff"
                c.state.message = f"back-off {c.restart_at - now:.0f}s restarting failed container"

    # ------------------------------------------------------------ sandbox

    def _sandbox(self) -> None:
        self.netns, self.ip = self.host.network.add_pod()
        self._write_info()
        write_etc(self.dir, self.pod, self.ip, self.host.network.gateway)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.gpus = self.host.gpus.take(self.node, self.pod)
        deadline = time.monotonic() + VOLUME_RETRY_SECONDS
        while True:
            try:
                write_volumes(self.dir / "volumes", self.pod, self.host.kube, self.ip, self.host_ip)
                self._environments()
                return
            except (ValueError, KeyError, StopIteration, ApiError) as exc:
                if time.monotonic() > deadline:
                    raise
                if self.deletion_grace() is not None:
                    self._final_delete()
                    raise PodGone from None
                for c in self.containers:
                    c.state.reason, c.state.message = "ContainerCreating", str(exc)
                self._report()
                self._sleep(2)

    @property
    def host_ip(self) -> str:
        return NODE_IP

    def _environments(self) -> None:
        base = {
            "PATH": self.host.path,
            "HOME": HOME,
            "HOSTNAME": spec.pod_hostname(self.pod),
            "LANG": os.environ.get("LANG", "C.UTF-8"),
            # Every pod of this node shares the host's few cores, so Open MPI's ranks
            # yield a core while they wait instead of spinning on it (its default
            # where a node has a core per rank): a rank whose peer is stopped or
            # slower held a whole core, 8 CPU-s in 10 s against 2.4 with the yield,
            # with the other tests beside it. The launcher's value reaches the ranks
            # (horovodrun forwards its environment); a pod's own env still wins.
            "OMPI_MCA_mpi_yield_when_idle": "1",
        }
        if self.host.python_path:
            base["PYTHONPATH"] = self.host.python_path
        if self.gpus and self.host.host_has_gpus:
            base["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in self.gpus)
        elif not self.host.host_has_gpus:
            # The nodes' GPUs are pretend ones on a host without any: the trainers
            # are told that training on the CPU is expected. Every container, the
            # launcher's too: horovodrun hands its environment to the ranks.
            base[contract.ENV_ALLOW_CPU] = "1"

        def lookup(kind: str, name: str) -> dict[str, str] | None:
            obj = self.host.kube.object_data(kind, self.namespace, name)
            if obj is None:
                return None
            data = spec.secret_data(obj) if kind == "secretRef" else spec.config_map_data(obj)
            return {k: v.decode(errors="replace") for k, v in data.items()}

        for c in self.containers:
            c.env = spec.container_env(
                self.pod,
                c.spec,
                pod_ip=self.ip,
                host_ip=self.host_ip,
                node_allocatable=self.host.allocatable,
                lookup=lookup,
                base=base,
            )

    # ------------------------------------------------------------ containers

    def _container(self, c: Obj, init: bool) -> Container:
        state = ContainerState(name=c["name"], image=c.get("image", ""))
        if init:
            state.reason = "PodInitializing"
        container = Container(spec=c, state=state, init=init)
        # The kubelet's probe workers start ticking when it takes the pod on.
        taken_on = time.monotonic()
        if not init and c.get("startupProbe"):
            container.startup = Probe(c["startupProbe"], ticks_from=taken_on)
        if not init and c.get("readinessProbe"):
            container.readiness = Probe(c["readinessProbe"])
        if not init and c.get("livenessProbe"):
            container.liveness = Probe(c["livenessProbe"], ticks_from=taken_on)
        return container

    def _start(self, c: Container) -> None:
        name = c.spec["name"]
        try:
            argv = spec.command_line(c.spec, c.env)
            user = spec.run_as(self.pod, c.spec)
            env = c.env
            if user.uid != 0 and env.get("HOME") == HOME:
                env = {**env, "HOME": spec.NON_ROOT_HOME}
            launch = {
                "hostname": spec.pod_hostname(self.pod),
                "mounts": [
                    *reachable_mounts(self.host.shared_paths, user.uid),
                    *container_mounts(self.dir, self.pod, c.spec, self.host),
                ],
                "workingDir": c.spec.get("workingDir"),
                "argv": argv,
                "env": env,
                "user": dataclasses.asdict(user),
            }
        except (ValueError, KeyError) as exc:
            # Unrunnable (no command, a bad reference): a container that failed at once.
            s = c.state
            s.state, s.reason, s.message, s.exit_code = "terminated", "StartError", str(exc), 128
            s.started_at = s.finished_at = spec.now()
            return
        spec_file = self.dir / f"{name}.json"
        spec_file.write_text(json.dumps(launch))
        log_path = self.log_dir / f"{name}.log"
        assert self.netns is not None
        with open(log_path, "ab") as out:
            c.proc = subprocess.Popen(
                netns.sandbox_command(self.netns, sys.executable, str(PODINIT), str(spec_file)),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env=env,
            )
        s = c.state
        s.state, s.reason, s.message, s.exit_code = "running", "", "", None
        s.started_at, s.finished_at, s.ready = spec.now(), None, False
        s.startup_done = c.startup is None
        s.container_id = f"nodeagent://{self.uid[:8]}-{name}-{s.restart_count}-{c.proc.pid}"
        for probe in (c.startup, c.readiness, c.liveness):
            if probe is not None:
                probe.restart(time.monotonic())
        self._write_info()
        log.info(
            "%s/%s: started %s (pid %d): %s",
            self.namespace,
            self.pod_name,
            name,
            c.proc.pid,
            " ".join(argv),
        )

    def _reap(self, c: Container) -> None:
        assert c.proc is not None
        code = spec.exit_code_of(c.proc.wait())
        s = c.state
        s.state, s.exit_code, s.finished_at, s.ready = "terminated", code, spec.now(), False
        s.reason = spec.exit_reason(code)
        s.message = self._termination_message(c, code)
        c.proc = None
        log.info("%s/%s: %s exited with %d", self.namespace, self.pod_name, s.name, code)

    def _termination_message(self, c: Container, code: int) -> str:
        """terminationMessagePath's content, else (FallbackToLogsOnError) the log's tail."""
        name = c.spec["name"]
        with contextlib.suppress(OSError):
            written = (self.dir / f"{name}.termination-log").read_bytes()
            (self.dir / f"{name}.termination-log").write_bytes(b"")
            if written.strip():
                return written[-spec.TERMINATION_MESSAGE_BYTES :].decode(errors="replace")
        if code == 0 or c.spec.get("terminationMessagePolicy") != "FallbackToLogsOnError":
            return ""
        with contextlib.suppress(OSError):
            return spec.log_tail((self.log_dir / f"{name}.log").read_bytes())
        return ""

    def _probe(self, c: Container, now: float) -> None:
        """Take each finished probe run's result, and start the runs that are due.

        As the kubelet: only the startup probe runs until it succeeds, then only
        readiness and liveness, the first of them at once (initialDelaySeconds
        still counts from the container's start). A failed startup or liveness
        probe kills the container; the restart policy decides what follows.
        """
        for probe in (c.startup, c.readiness, c.liveness):
            if probe is None or c.proc is None:
                continue
            if (probe is c.startup) == c.state.startup_done:
                continue
            result = probe.take_result()
            if result is not None:
                if probe.record(result) and probe is not c.readiness:
                    kind = "startup" if probe is c.startup else "liveness"
                    log.info(
                        "%s/%s: %s failed its %s probe; killing it",
                        self.namespace,
                        self.pod_name,
                        c.state.name,
                        kind,
                    )
                    self._signal(c, signal.SIGKILL)
                    continue
                if probe is c.startup and probe.ok:
                    c.state.startup_done = True
                    continue
            if probe.due(now):
                probe.ran(now)
                self._run_probe(c, probe)
        c.state.ready = (
            c.proc is not None and c.state.startup_done and (c.readiness is None or c.readiness.ok)
        )

    def _run_probe(self, c: Container, probe: Probe) -> None:
        assert self.netns is not None and c.proc is not None
        netns_name, pod_ip, container, pid, env = self.netns, self.ip, c.spec, c.proc.pid, c.env
        probe.start(
            lambda: probes.run(
                probe, netns=netns_name, pod_ip=pod_ip, container=container, pid=pid, env=env
            ),
            self._wake.set,
        )

    def _signal(self, c: Container, sig: int) -> None:
        if c.proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(c.proc.pid, sig)

    def _stop(self, grace: float) -> None:
        """SIGTERM every container's process group, SIGKILL what is left after `grace`."""
        running = [c for c in self.containers if c.proc is not None]
        for c in running:
            self._signal(c, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(c.proc.poll() is None for c in running if c.proc):
            if self._gone.wait(TICK):
                break
        for c in running:
            self._signal(c, signal.SIGKILL)
        if self.netns:
            netns.kill_netns_processes(self.netns)
        for c in running:
            if c.proc is not None:
                self._reap(c)

    def _final_delete(self) -> None:
        with contextlib.suppress(ApiError):
            self._report()
        self._teardown()
        self.host.kube.delete_pod_now(self.namespace, self.pod_name, self.uid)
        log.info("%s/%s: deleted", self.namespace, self.pod_name)

    def _teardown(self) -> None:
        for c in self.containers:
            if c.proc is not None:
                self._signal(c, signal.SIGKILL)
        if self.netns:
            netns.delete_netns(self.netns)
            self.host.network.remove_pod(self.netns, self.ip)
            self.netns = None
        for c in self.containers:
            if c.proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    c.proc.wait(timeout=5)
        self.host.gpus.give_back(self.node, self.gpus)
        self.gpus = []
        self._write_info()

    # ------------------------------------------------------------ status

    def _report(self) -> str:
        """Send the status if it changed; returns its phase. PodGone when the pod is gone."""
        status = self.status()
        if not self._status.send(status):
            raise PodGone
        return str(status["phase"])

    def _write_info(self) -> None:
        """What `nodeagent ps` and `nodeagent exec` read."""
        self.dir.mkdir(parents=True, exist_ok=True)
        info = {
            "namespace": self.namespace,
            "pod": self.pod_name,
            "uid": self.uid,
            "node": self.node,
            "netns": self.netns,
            "ip": self.ip,
            "logs": str(self.log_dir),
            "containers": {
                c.spec["name"]: c.proc.pid for c in self.containers if c.proc is not None
            },
        }
        tmp = self.dir / "info.json.tmp"
        tmp.write_text(json.dumps(info))
        tmp.replace(self.dir / "info.json")


def running_info(pods_dir: Path) -> list[dict[str, Any]]:
    out = []
    for path in sorted(pods_dir.glob("*/info.json")):
        with contextlib.suppress(OSError, ValueError):
            out.append(json.loads(path.read_text()))
    return out
