"""One pod, from binding to deletion: what a kubelet's pod worker does, in one thread."""

from __future__ import annotations

import contextlib
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
from typing import TYPE_CHECKING, Any

from . import netns, spec
from .kube import KubeError
from .spec import NODE_IP, ContainerState, Obj

if TYPE_CHECKING:
    from .agent import Agent

log = logging.getLogger("nodeagent.pod")

PODINIT = Path(__file__).resolve().parent / "podinit.py"
TICK = 0.2
# Restart back-off: the kubelet's starts at 10s and doubles to 5 minutes; a local
# test run wants failures retried sooner.
BACKOFF_START, BACKOFF_MAX = 1.0, 20.0
# Containers run as root, with the host's root HOME.
HOME = "/root"
SHELL_RC_FILES = (f"{HOME}/.bashrc", f"{HOME}/.profile", f"{HOME}/.bash_profile")
# Directories that are private to each pod: (name under the pod's dir, path, mode).
PRIVATE_DIRS = (("ssh", f"{HOME}/.ssh", 0o700), ("tmp", "/tmp", 0o1777))
# How long a pod may wait for a missing Secret/ConfigMap before it fails.
VOLUME_RETRY_SECONDS = 120


class PodGone(Exception):
    """The pod left the API server (or the agent is stopping): stop at once."""


@dataclass
class Probe:
    """A readiness or liveness probe of one container and its counters."""

    spec: Obj
    next_at: float = 0.0
    successes: int = 0
    failures: int = 0
    ok: bool = False

    def period(self) -> float:
        return float(self.spec.get("periodSeconds", 10))

    def timeout(self) -> float:
        return float(self.spec.get("timeoutSeconds", 1))


@dataclass
class Container:
    spec: Obj
    state: ContainerState
    init: bool = False
    proc: subprocess.Popen[bytes] | None = None
    env: dict[str, str] = field(default_factory=dict)
    readiness: Probe | None = None
    liveness: Probe | None = None
    restart_at: float | None = None
    backoff: float = BACKOFF_START


class PodRunner(threading.Thread):
    def __init__(self, agent: Agent, pod: Obj):
        meta = pod["metadata"]
        super().__init__(name=f"pod-{meta['namespace']}/{meta['name']}", daemon=True)
        self.agent = agent
        self.pod = pod
        self.uid: str = meta["uid"]
        self.namespace: str = meta["namespace"]
        self.pod_name: str = meta["name"]
        self.node: str = pod["spec"]["nodeName"]
        self.restart_policy: str = pod["spec"].get("restartPolicy", "Always")
        self.dir = agent.pods_dir / self.uid
        self.log_dir = agent.logs_dir / f"{self.namespace}_{self.pod_name}_{self.uid}"
        self._lock = threading.Lock()
        self._gone = threading.Event()
        self.netns: str | None = None
        self.ip = ""
        self.start_time = spec.now()
        self.gpus: list[int] = []
        self._conditions: dict[str, tuple[bool, str]] = {}
        self._sent: Obj | None = None
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

    def container_running(self, name: str) -> bool:
        return any(c.spec["name"] == name and c.proc is not None for c in self.containers)

    def reported_phase(self) -> str | None:
        """The phase the API server last accepted from this runner."""
        return str(self._sent["phase"]) if self._sent else None

    def deletion_grace(self) -> float | None:
        with self._lock:
            meta = self.pod["metadata"]
        if not meta.get("deletionTimestamp"):
            return None
        return float(meta.get("deletionGracePeriodSeconds") or 0)

    # ------------------------------------------------------------ the pod's life

    def run(self) -> None:
        try:
            self._run()
        except PodGone:
            log.info("%s/%s: stopped", self.namespace, self.pod_name)
        except Exception:
            log.exception("%s/%s: pod worker failed", self.namespace, self.pod_name)
            with contextlib.suppress(Exception):
                self._fail_pod("NodeAgentError", "the node agent failed; see its log")
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
            if phase in ("Succeeded", "Failed") and self._sent is not None:
                log.info("%s/%s: %s", self.namespace, self.pod_name, phase)
                return
            self._sleep(TICK)

    def _sleep(self, seconds: float) -> None:
        if self._gone.wait(seconds) or self.agent.stopping.is_set():
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
        self.netns, self.ip = self.agent.network.add_pod()
        self._write_info()
        etc = self.dir / "etc"
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "hosts").write_text(spec.hosts_file(self.pod, self.ip))
        (etc / "resolv.conf").write_text(
            spec.resolv_conf(self.namespace, self.agent.network.gateway)
        )
        (etc / "hostname").write_text(spec.pod_hostname(self.pod) + "\n")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.gpus = self.agent.allocate_gpus(self)
        deadline = time.monotonic() + VOLUME_RETRY_SECONDS
        while True:
            try:
                self._volumes()
                self._environments()
                return
            except (ValueError, KeyError, StopIteration, KubeError) as exc:
                if time.monotonic() > deadline:
                    raise
                if self.deletion_grace() is not None:
                    self._final_delete()
                    raise PodGone from None
                for c in self.containers:
                    c.state.reason, c.state.message = "ContainerCreating", str(exc)
                self._report()
                self._sleep(2)

    def _volumes(self) -> None:
        root = self.dir / "volumes"
        for volume in self.pod["spec"].get("volumes") or []:
            target = root / volume["name"]
            if "hostPath" in volume:
                continue
            target.mkdir(parents=True, exist_ok=True)
            files: list[spec.VolumeFile] = []
            if "secret" in volume:
                src = volume["secret"]
                obj = self.agent.kube.object_data("secretRef", self.namespace, src["secretName"])
                files = spec.secret_files(obj, src)
            elif "configMap" in volume:
                src = volume["configMap"]
                obj = self.agent.kube.object_data("configMapRef", self.namespace, src["name"])
                files = spec.config_map_files(obj, src)
            elif "downwardAPI" in volume:
                files = spec.downward_files(self.pod, volume["downwardAPI"], self.ip, self.host_ip)
            elif "projected" in volume:
                files = self._projected(volume["projected"])
            elif "emptyDir" in volume:
                target.chmod(0o777)
            else:
                kinds = sorted(set(volume) - {"name"})
                raise ValueError(f"volume {volume['name']!r}: {kinds} is not supported")
            for f in files:
                path = target / f.path
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(f.content)
                path.chmod(f.mode)

    def _projected(self, projected: Obj) -> list[spec.VolumeFile]:
        default_mode = projected.get("defaultMode", spec.DEFAULT_FILE_MODE)
        files: list[spec.VolumeFile] = []
        kube = self.agent.kube
        for source in projected.get("sources") or []:
            if "secret" in source:
                src = {
                    "defaultMode": default_mode,
                    **source["secret"],
                    "secretName": source["secret"]["name"],
                }
                obj = kube.object_data("secretRef", self.namespace, src["name"])
                files += spec.secret_files(obj, src)
            elif "configMap" in source:
                src = {"defaultMode": default_mode, **source["configMap"]}
                obj = kube.object_data("configMapRef", self.namespace, src["name"])
                files += spec.config_map_files(obj, src)
            elif "downwardAPI" in source:
                src = {"defaultMode": default_mode, **source["downwardAPI"]}
                files += spec.downward_files(self.pod, src, self.ip, self.host_ip)
            elif "serviceAccountToken" in source:
                src = source["serviceAccountToken"]
                token = kube.service_account_token(
                    self.namespace,
                    self.pod["spec"].get("serviceAccountName") or "default",
                    self.pod,
                    src.get("audience"),
                    int(src.get("expirationSeconds", 3600)),
                )
                files.append(spec.VolumeFile(src["path"], token.encode(), default_mode))
        return files

    def _mounts(self, container: Obj) -> list[Obj]:
        volumes = {v["name"]: v for v in self.pod["spec"].get("volumes") or []}
        etc = self.dir / "etc"
        mounts = [
            {"source": str(etc / name), "target": f"/etc/{name}", "readOnly": False}
            for name in ("hosts", "resolv.conf", "hostname")
        ]
        # A container has a file system of its own; here the host's stands in, so at
        # least ~/.ssh and /tmp are the pod's own: sshd's keys and configs, ssh's
        # known_hosts and temporary files never touch the host's or another pod's.
        # (Not all of HOME: the host's Python may live there, e.g. ~/.pyenv.)
        for name, target, mode in PRIVATE_DIRS:
            if any(path.is_relative_to(target) for path in self.agent.shared_paths):
                # e.g. a checkout under /tmp: a private /tmp would hide the venv.
                continue
            private = self.dir / name
            private.mkdir(exist_ok=True)
            private.chmod(mode)
            if target != "/tmp":
                self.agent.ensure_mountpoint(Path(target), is_dir=True)
            mounts.append({"source": str(private), "target": target, "readOnly": False})
        # The host's shell start-up files are not the image's: one that puts another
        # Python first on PATH (pyenv shims) would break every rank started over ssh.
        for rc in SHELL_RC_FILES:
            if Path(rc).exists():
                blank = etc / "shell-rc"
                blank.write_text("# the node agent hides the host's shell start-up files\n")
                mounts.append({"source": str(blank), "target": rc, "readOnly": True})
        message_file = self.dir / f"{container['name']}.termination-log"
        message_file.touch()
        message_path = container.get("terminationMessagePath") or "/dev/termination-log"
        self.agent.ensure_mountpoint(Path(message_path), is_dir=False)
        mounts.append({"source": str(message_file), "target": message_path, "readOnly": False})
        for m in container.get("volumeMounts") or []:
            volume = volumes[m["name"]]
            if "hostPath" in volume:
                source = Path(volume["hostPath"]["path"])
            else:
                source = self.dir / "volumes" / m["name"]
            if m.get("subPath"):
                source = source / m["subPath"]
                if not source.exists():
                    source.mkdir(parents=True)
            target = m["mountPath"]
            if not any(target.startswith(f"{p}/") for _, p, _ in PRIVATE_DIRS):
                # Under the private directories podinit makes the mount point itself.
                self.agent.ensure_mountpoint(Path(target), is_dir=source.is_dir())
            mounts.append(
                {"source": str(source), "target": target, "readOnly": bool(m.get("readOnly"))}
            )
        return mounts

    @property
    def host_ip(self) -> str:
        return NODE_IP

    def _environments(self) -> None:
        base = {
            "PATH": self.agent.path,
            "HOME": HOME,
            "HOSTNAME": spec.pod_hostname(self.pod),
            "LANG": os.environ.get("LANG", "C.UTF-8"),
        }
        if self.gpus and self.agent.host_has_gpus:
            base["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in self.gpus)

        def lookup(kind: str, name: str) -> dict[str, str] | None:
            obj = self.agent.kube.object_data(kind, self.namespace, name)
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
                node_allocatable=self.agent.allocatable,
                lookup=lookup,
                base=base,
            )

    # ------------------------------------------------------------ containers

    def _container(self, c: Obj, init: bool) -> Container:
        state = ContainerState(name=c["name"], image=c.get("image", ""))
        if init:
            state.reason = "PodInitializing"
        container = Container(spec=c, state=state, init=init)
        if not init and c.get("readinessProbe"):
            container.readiness = Probe(c["readinessProbe"])
        if not init and c.get("livenessProbe"):
            container.liveness = Probe(c["livenessProbe"])
        return container

    def _start(self, c: Container) -> None:
        name = c.spec["name"]
        try:
            argv = spec.command_line(c.spec, c.env)
            launch = {
                "hostname": spec.pod_hostname(self.pod),
                "mounts": self._mounts(c.spec),
                "workingDir": c.spec.get("workingDir"),
                "argv": argv,
                "env": c.env,
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
                [
                    "ip",
                    "netns",
                    "exec",
                    self.netns,
                    "unshare",
                    "--uts",
                    "--mount",
                    "--propagation",
                    "private",
                    "--",
                    sys.executable,
                    str(PODINIT),
                    str(spec_file),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env=c.env,
            )
        s = c.state
        s.state, s.reason, s.message, s.exit_code = "running", "", "", None
        s.started_at, s.finished_at, s.ready = spec.now(), None, False
        s.container_id = f"nodeagent://{self.uid[:8]}-{name}-{s.restart_count}-{c.proc.pid}"
        for probe in (c.readiness, c.liveness):
            if probe is not None:
                probe.successes = probe.failures = 0
                probe.ok = False
                probe.next_at = time.monotonic() + float(probe.spec.get("initialDelaySeconds", 0))
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
        for probe, readiness in ((c.readiness, True), (c.liveness, False)):
            if probe is None or now < probe.next_at:
                continue
            probe.next_at = now + probe.period()
            ok = self._run_probe(c, probe)
            if ok:
                probe.successes, probe.failures = probe.successes + 1, 0
                if probe.successes >= int(probe.spec.get("successThreshold", 1)):
                    probe.ok = True
            else:
                probe.failures, probe.successes = probe.failures + 1, 0
                if probe.failures >= int(probe.spec.get("failureThreshold", 3)):
                    probe.ok = False
                    if not readiness and c.proc is not None:
                        log.info(
                            "%s/%s: %s failed its liveness probe; killing it",
                            self.namespace,
                            self.pod_name,
                            c.state.name,
                        )
                        self._signal(c, signal.SIGKILL)
        c.state.ready = c.proc is not None and (c.readiness is None or c.readiness.ok)

    def _run_probe(self, c: Container, probe: Probe) -> bool:
        assert self.netns is not None and c.proc is not None
        handler = probe.spec
        try:
            if "tcpSocket" in handler:
                port = self._port(c, handler["tcpSocket"]["port"])
                host = handler["tcpSocket"].get("host") or self.ip
                return netns.tcp_probe(self.netns, host, port, probe.timeout())
            if "httpGet" in handler:
                h = handler["httpGet"]
                return netns.http_probe(
                    self.netns,
                    h.get("host") or self.ip,
                    self._port(c, h["port"]),
                    h.get("path", "/"),
                    probe.timeout(),
                )
            if "exec" in handler:
                proc = subprocess.run(
                    [
                        "nsenter",
                        "-t",
                        str(c.proc.pid),
                        "-n",
                        "-m",
                        "-u",
                        "--",
                        *handler["exec"]["command"],
                    ],
                    env=c.env,
                    capture_output=True,
                    timeout=probe.timeout(),
                )
                return proc.returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            return False
        return True

    @staticmethod
    def _port(c: Container, port: int | str) -> int:
        if isinstance(port, int) or str(port).isdigit():
            return int(port)
        for p in c.spec.get("ports") or []:
            if p.get("name") == port:
                return int(p["containerPort"])
        raise ValueError(f"no container port named {port!r}")

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
        with contextlib.suppress(KubeError):
            self._report()
        self._teardown()
        self.agent.kube.delete_pod_now(self.namespace, self.pod_name, self.uid)
        log.info("%s/%s: deleted", self.namespace, self.pod_name)

    def _teardown(self) -> None:
        for c in self.containers:
            if c.proc is not None:
                self._signal(c, signal.SIGKILL)
        if self.netns:
            netns.delete_netns(self.netns)
            self.agent.network.remove_pod(self.netns, self.ip)
            self.netns = None
        for c in self.containers:
            if c.proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    c.proc.wait(timeout=5)
        self.agent.release_gpus(self)
        self._write_info()

    # ------------------------------------------------------------ status

    def _phase(self) -> str:
        mains = [c.state for c in self.containers if not c.init]
        return spec.pod_phase(self.restart_policy, self.init_done, self.init_failed, mains)

    def status(self) -> Obj:
        phase = self._phase()
        mains = [c for c in self.containers if not c.init]
        ready = phase == "Running" and all(c.state.ready for c in mains)
        initialized = self.init_done or not any(c.init for c in self.containers)
        conditions = {
            "PodReadyToStartContainers": bool(self.ip),
            "Initialized": initialized,
            "ContainersReady": ready,
            "Ready": ready,
            "PodScheduled": True,
        }
        out: list[Obj] = []
        for kind, ok in conditions.items():
            prev = self._conditions.get(kind)
            if prev is None or prev[0] != ok:
                self._conditions[kind] = (ok, spec.now())
            reason = None
            if not ok:
                reason = (
                    "PodCompleted"
                    if phase in ("Succeeded", "Failed")
                    else (
                        "ContainersNotInitialized"
                        if kind == "Initialized"
                        else "ContainersNotReady"
                    )
                )
            out.append(spec.condition(kind, ok, reason, self._conditions[kind][1]))
        status: Obj = {
            "phase": phase,
            "conditions": out,
            "hostIP": self.host_ip,
            "hostIPs": [{"ip": self.host_ip}],
            "startTime": self.start_time,
            "containerStatuses": [c.state.to_status() for c in mains],
        }
        if self.ip:
            status["podIP"] = self.ip
            status["podIPs"] = [{"ip": self.ip}]
        inits = [c.state.to_status() for c in self.containers if c.init]
        if inits:
            status["initContainerStatuses"] = inits
        return status

    def _report(self) -> str:
        status = self.status()
        if status != self._sent:
            self._sent = None
            try:
                self.agent.kube.patch_pod_status(self.namespace, self.pod_name, status)
                self._sent = status
            except KubeError as exc:
                if exc.status == 404:
                    raise PodGone from None
                log.warning("%s/%s: status update failed: %s", self.namespace, self.pod_name, exc)
            except Exception as exc:  # the API server unreachable for a moment: next tick
                log.warning("%s/%s: status update failed: %s", self.namespace, self.pod_name, exc)
        return str(status["phase"])

    def _fail_pod(self, reason: str, message: str) -> None:
        status = self.status()
        status.update({"phase": "Failed", "reason": reason, "message": message})
        self.agent.kube.patch_pod_status(self.namespace, self.pod_name, status)

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
