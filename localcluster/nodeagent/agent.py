"""The agent: registers its nodes, runs their pods, and removes everything on exit."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import threading
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import dns, logserver, netns, preflight, spec
from .gpus import GPU, GpuPool
from .kube import ApiError, Kube
from .pod import PodRunner
from .podhost import PodHost

log = logging.getLogger("nodeagent")

Obj = dict[str, Any]
NODE_KIND_LABEL = "horovod.ai/node-kind"
NODE_KIND = "local"
TAINT_KEY = "horovod.ai/local-node"
HEARTBEAT_SECONDS = 10


@dataclass
class Options:
    kubeconfig: Path
    state_dir: Path
    nodes: list[str]
    gpus: int
    cpu: str
    memory: str
    subnet: str
    taint: bool
    path_prefix: str
    python_path: str = ""


def netns_prefix(state_dir: Path) -> str:
    """Namespaces are named after the state dir, so two agents never touch each other's."""
    return "hvna" + hashlib.sha1(str(state_dir.resolve()).encode()).hexdigest()[:6]


class Agent(PodHost):
    """The node agent; what its pods' runners use of it is the PodHost protocol."""

    def __init__(self, opts: Options):
        self.opts = opts
        self.state = opts.state_dir.resolve()
        self.pods_dir = self.state / "pods"
        self.logs_dir = self.state / "logs"
        self.record = self.state / "agent.json"
        self.prefix = netns_prefix(self.state)
        self.network = netns.Network(self.prefix, opts.subnet)
        self.path = (
            f"{opts.path_prefix}:{spec.DEFAULT_PATH}" if opts.path_prefix else (spec.DEFAULT_PATH)
        )
        self.python_path = opts.python_path
        # Host paths every pod must see: its own state (volume sources) and the
        # programs standing in for the image. A pod-private directory never hides them.
        self.shared_paths = [
            self.state,
            *(Path(p).resolve() for p in (opts.path_prefix or "").split(":") if p),
            *(Path(p).resolve() for p in opts.python_path.split(":") if p),
            # The interpreter a venv links to (its stdlib and binary), wherever it is.
            *(
                (Path(p) / "python").resolve().parent.parent
                for p in (opts.path_prefix or "").split(":")
                if p and (Path(p) / "python").exists()
            ),
        ]
        self.allocatable = {
            "cpu": opts.cpu,
            "memory": opts.memory,
            "pods": "110",
            "ephemeral-storage": "100Gi",
            GPU: str(opts.gpus),
        }
        self.host_has_gpus = Path("/dev/nvidia0").exists()
        self.stopping = threading.Event()
        self.runners: dict[str, PodRunner] = {}
        self._lock = threading.Lock()
        self._created: list[str] = []
        self.gpus = GpuPool(opts.nodes, opts.gpus)
        self._node_uids: dict[str, str] = {}
        self._started = spec.now()
        self._claimed = False
        self.kube: Kube
        self.coredns: dns.CoreDNS | None = None
        self.forwarder: netns.ApiForwarder | None = None
        self.logserver: logserver.LogServer | None = None

    # ------------------------------------------------------------ start and stop

    def start(self) -> None:
        preflight.check(self.prefix)
        binary = dns.build()
        self._claim_state_dir()
        self.kube = Kube(self.opts.kubeconfig)
        url = urllib.parse.urlparse(self.kube.server)
        if url.hostname not in ("127.0.0.1", "localhost") or url.port is None:
            raise preflight.PreflightError(
                f"the API server is {self.kube.server}; the agent supports a local control plane "
                "on 127.0.0.1 only (hack/cluster.sh up). Fix: point --kubeconfig at it."
            )
        self.network.up()
        self.forwarder = netns.ApiForwarder(self.network.infra, url.port)
        self.forwarder.start()
        self.coredns = dns.CoreDNS(
            self.network.infra,
            self.network.gateway,
            self.opts.kubeconfig.resolve(),
            self.state / "coredns",
        )
        pid = self.coredns.start(binary)
        log.info("CoreDNS (pid %d) serves cluster.local on %s:53", pid, self.network.gateway)
        self.logserver = logserver.LogServer(
            self.find_log, self.state / "pki", logserver.LogClock(self.logs_dir)
        )
        self.logserver.start()
        for name in self.opts.nodes:
            self._register(name)
        threading.Thread(target=self._heartbeat, name="heartbeat", daemon=True).start()
        for name in self.opts.nodes:
            threading.Thread(
                target=self._watch, args=(name,), name=f"watch-{name}", daemon=True
            ).start()
        log.info("ready: nodes %s", ", ".join(self.opts.nodes))

    def shutdown(self) -> None:
        """Stop every pod, remove the nodes, the namespaces and the mount points."""
        if not self._claimed:
            return  # stopped before it made anything
        log.info("shutting down")
        self.stopping.set()
        with self._lock:
            runners = list(self.runners.values())
        for r in runners:
            r.finished.wait(15)
        for r in runners:
            if r.reported_phase() in ("Succeeded", "Failed"):
                continue
            with contextlib.suppress(Exception):
                r.fail(
                    "NodeShutdown",
                    "the local node agent stopped; the pod's processes were killed",
                )
        if hasattr(self, "kube"):
            for name in self.opts.nodes:
                with contextlib.suppress(Exception):
                    self.kube.delete_node(name)
            self.kube.close()
        if self.coredns is not None:
            self.coredns.stop()
        if self.forwarder is not None:
            self.forwarder.stop()
        if self.logserver is not None:
            self.logserver.stop()
        self.network.down()
        self._remove_created()
        shutil.rmtree(self.pods_dir, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            self.record.unlink()
        log.info("stopped; logs stay in %s", self.logs_dir)

    def _claim_state_dir(self) -> None:
        """Refuse a state dir another live agent uses; clear what a crashed one left."""
        self.state.mkdir(parents=True, exist_ok=True)
        if self.record.exists():
            old = json.loads(self.record.read_text())
            pid = int(old.get("pid", 0))
            if pid and pid != os.getpid() and _is_agent(pid):
                raise preflight.PreflightError(
                    f"another node agent (pid {pid}) runs from {self.state}. Fix: stop it "
                    "(kill -TERM {pid}) or use another --state-dir."
                )
        cleanup(self.state)
        self._claimed = True
        self.pods_dir.mkdir(parents=True, exist_ok=True)
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        self._save()

    def _save(self) -> None:
        data = {"pid": os.getpid(), "prefix": self.prefix, "created": self._created}
        tmp = self.record.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(self.record)

    def ensure_mountpoint(self, path: Path, is_dir: bool) -> None:
        """Create a missing mount point on the host (empty; removed when the agent stops)."""
        with self._lock:
            if path.exists() or path.is_symlink():
                return
            top = path
            while not top.parent.exists():
                top = top.parent
            if is_dir:
                path.mkdir(parents=True)
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.touch()
            self._created.append(str(top))
            self._save()

    def _remove_created(self) -> None:
        _remove_mountpoints(self._created)
        self._created = []

    def find_log(self, namespace: str, pod: str, container: str) -> Any:
        """For the log endpoint: the newest log file of that container, and whether it runs."""
        with self._lock:
            runners = [
                r for r in self.runners.values() if r.namespace == namespace and r.pod_name == pod
            ]
        if runners:
            runner = runners[-1]
            path = runner.log_dir / f"{container}.log"
            if path.exists():
                return path, lambda: runner.container_running(container)
        paths = sorted(
            self.logs_dir.glob(f"{namespace}_{pod}_*/{container}.log"),
            key=lambda p: p.stat().st_mtime,
        )
        return (paths[-1], lambda: False) if paths else None

    # ------------------------------------------------------------ nodes

    def _node(self, name: str) -> Obj:
        labels = {
            NODE_KIND_LABEL: NODE_KIND,
            "kubernetes.io/hostname": name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
        }
        if self.opts.gpus:
            labels["nvidia.com/gpu.present"] = "true"
        taints = [{"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"}]
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": labels,
                "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
            },
            "spec": {"taints": taints if self.opts.taint else None},
            "status": self._node_status(),
        }

    def _node_status(self) -> Obj:
        t = spec.now()

        def cond(kind: str, status: str, reason: str, message: str) -> Obj:
            return {
                "type": kind,
                "status": status,
                "reason": reason,
                "message": message,
                "lastHeartbeatTime": t,
                "lastTransitionTime": self._started,
            }

        return {
            "capacity": self.allocatable,
            "allocatable": self.allocatable,
            "conditions": [
                cond("Ready", "True", "KubeletReady", "the local node agent runs pods"),
                cond("MemoryPressure", "False", "KubeletHasSufficientMemory", ""),
                cond("DiskPressure", "False", "KubeletHasNoDiskPressure", ""),
                cond("PIDPressure", "False", "KubeletHasSufficientPID", ""),
            ],
            # The API server reaches the log endpoint here; pods cannot (no route to it).
            "addresses": [{"type": "InternalIP", "address": spec.NODE_IP}],
            "daemonEndpoints": {
                "kubeletEndpoint": {"Port": self.logserver.port if self.logserver else 0}
            },
            "nodeInfo": {
                "architecture": "amd64",
                "operatingSystem": "linux",
                "kubeletVersion": "v0.0.0-nodeagent",
                "kubeProxyVersion": "",
                "containerRuntimeVersion": "nodeagent://processes",
                "kernelVersion": os.uname().release,
                "osImage": "host packages (localcluster.nodeagent)",
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
            },
        }

    def _register(self, name: str) -> None:
        self._node_uids[name] = self.kube.apply_node(self._node(name))
        self.kube.patch_node_status(name, self._node_status())
        self.kube.renew_lease(name, self._node_uids[name], _micro_now())

    def _heartbeat(self) -> None:
        while not self.stopping.wait(HEARTBEAT_SECONDS):
            for name in self.opts.nodes:
                try:
                    self.kube.patch_node_status(name, self._node_status())
                    self.kube.renew_lease(name, self._node_uids[name], _micro_now())
                except Exception as exc:
                    log.warning("heartbeat of %s failed: %s", name, exc)

    # ------------------------------------------------------------ pods

    def _watch(self, node: str) -> None:
        """List the node's pods, then watch them from the list's version, until stopping.

        A watch the server ended resumes from the last version seen (bookmarks carry
        it); an ERROR event (410 Gone: too old) or any failure lists again, and a
        runner whose pod is missing from the new list is told its pod is gone.
        """
        while not self.stopping.is_set():
            try:
                listed = self.kube.list_pods(node)
                seen = set()
                for pod in listed["items"]:
                    seen.add(pod["metadata"]["uid"])
                    self._handle("ADDED", pod)
                with self._lock:
                    stale = [r for u, r in self.runners.items() if r.node == node and u not in seen]
                for r in stale:
                    r.gone()
                version = listed["metadata"]["resourceVersion"]
                while not self.stopping.is_set():
                    with contextlib.closing(self.kube.watch_pods(node, version)) as events:
                        for event in events:
                            obj = event["object"]
                            version = obj["metadata"]["resourceVersion"]
                            if event["type"] != "BOOKMARK":
                                self._handle(event["type"], obj)
                            if self.stopping.is_set():
                                return
            except Exception as exc:
                if self.stopping.is_set():
                    return
                log.warning("watching pods of %s: %s; listing again", node, exc)
                time.sleep(1)

    def _handle(self, kind: str, pod: Obj) -> None:
        meta = pod["metadata"]
        uid = meta["uid"]
        with self._lock:
            runner = self.runners.get(uid)
            if kind == "DELETED":
                if runner is not None:
                    runner.gone()
                return
            if runner is not None:
                runner.update(pod)
                return
            if self.stopping.is_set():
                return
            phase = (pod.get("status") or {}).get("phase")
            if phase in ("Succeeded", "Failed"):
                return
            if meta.get("deletionTimestamp"):
                # Bound to us but never started (or started by an earlier run): nothing to stop.
                self.kube.delete_pod_now(meta["namespace"], meta["name"], uid)
                return
            if (pod.get("status") or {}).get("startTime"):
                # Started by an agent that crashed: its processes are gone with it.
                self._fail_orphan(pod)
                return
            runner = PodRunner(self, pod)
            self.runners[uid] = runner
        log.info("%s/%s: bound to %s; starting", meta["namespace"], meta["name"], runner.node)
        runner.start()

    def _fail_orphan(self, pod: Obj) -> None:
        meta = pod["metadata"]
        log.info(
            "%s/%s: started by an earlier agent run; marking it Failed",
            meta["namespace"],
            meta["name"],
        )
        with contextlib.suppress(ApiError):
            self.kube.patch_pod_status(
                meta["namespace"],
                meta["name"],
                {
                    "phase": "Failed",
                    "reason": "NodeAgentRestarted",
                    "message": "the node agent that ran this pod stopped; its processes are gone",
                },
            )


def _micro_now() -> str:
    import datetime as dt

    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _is_agent(pid: int) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"nodeagent" in cmdline


def _remove_mountpoints(paths: list[str]) -> None:
    """Remove mount points the agent created: only empty directories and empty files."""
    for top in reversed(paths):
        p = Path(top)
        if p.is_file() and p.stat().st_size == 0:
            p.unlink()
            continue
        if not p.is_dir():
            continue
        for dirpath, _dirnames, filenames in os.walk(p, topdown=False):
            for f in filenames:
                fp = Path(dirpath) / f
                if fp.stat().st_size == 0:
                    fp.unlink()
            with contextlib.suppress(OSError):
                Path(dirpath).rmdir()


def cleanup(state_dir: Path) -> list[str]:
    """Remove what an agent that used `state_dir` left: namespaces, processes, mount points."""
    state = state_dir.resolve()
    prefix = netns_prefix(state)
    removed = []
    for name in netns.list_netns(prefix):
        netns.delete_netns(name)
        removed.append(f"netns {name}")
    record = state / "agent.json"
    if record.exists():
        with contextlib.suppress(ValueError, OSError):
            created = json.loads(record.read_text()).get("created") or []
            _remove_mountpoints(created)
            removed += [f"mount point {p}" for p in created]
        record.unlink()
    if (state / "pods").exists():
        shutil.rmtree(state / "pods", ignore_errors=True)
    return removed
