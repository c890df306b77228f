"""Command line of the node agent (see the package docstring)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from .. import nodeagent as package
from ..paths import REPO, WORK
from . import agent as agent_mod
from . import dns
from .pod import running_info
from .preflight import PreflightError

DEFAULT_STATE = WORK / "nodeagent"


def _total_memory() -> str:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return f"{int(line.split()[1]) // 1024}Mi"
    return "8Gi"


def _run(args: argparse.Namespace) -> int:
    kubeconfig = args.kubeconfig or os.environ.get("KUBECONFIG")
    if not kubeconfig:
        print(
            "error: no kubeconfig. Fix: --kubeconfig PATH (hack/cluster.sh up writes one)",
            file=sys.stderr,
        )
        return 2
    opts = agent_mod.Options(
        kubeconfig=Path(kubeconfig),
        state_dir=Path(args.state_dir),
        nodes=[f"{args.node_prefix}{i}" for i in range(args.nodes)],
        gpus=args.gpus,
        cpu=args.cpu,
        memory=args.memory,
        subnet=args.subnet,
        taint=not args.no_taint,
        path_prefix=args.path_prefix,
        python_path=args.python_path,
    )
    agent = agent_mod.Agent(opts)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        agent.start()
    except (PreflightError, dns.DnsError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        agent.shutdown()
        return 1
    except BaseException:
        agent.shutdown()
        raise
    if args.ready_file:
        Path(args.ready_file).write_text(json.dumps({"pid": os.getpid(), "nodes": opts.nodes}))
    try:
        while not stop.wait(1):
            pass
    finally:
        agent.shutdown()
        if args.ready_file:
            Path(args.ready_file).unlink(missing_ok=True)
    return 0


def _find_pod(state: Path, pod: str, namespace: str | None) -> dict[str, str]:
    """A pod's log dir and info: exact name first, else the newest pod whose name starts so."""
    candidates = []
    for d in (state / "logs").glob("*_*_*"):
        ns, name, uid = d.name.split("_", 2)
        if namespace and ns != namespace:
            continue
        if name == pod or name.startswith(pod):
            candidates.append((name == pod, d.stat().st_mtime, ns, name, uid, d))
    if not candidates:
        raise SystemExit(f"error: no logs of a pod named {pod!r} under {state / 'logs'}")
    _, _, ns, name, uid, d = max(candidates)
    return {"namespace": ns, "pod": name, "uid": uid, "logs": str(d)}


def _container_running(state: Path, uid: str, container: str) -> bool:
    info = state / "pods" / uid / "info.json"
    try:
        return container in json.loads(info.read_text())["containers"]
    except (OSError, ValueError, KeyError):
        return False


def _logs(args: argparse.Namespace) -> int:
    state = Path(args.state_dir)
    found = _find_pod(state, args.pod, args.namespace)
    logs = sorted(Path(found["logs"]).glob("*.log"))
    if args.container:
        logs = [p for p in logs if p.stem == args.container]
    if not logs:
        raise SystemExit(f"error: pod {found['pod']} has no log of container {args.container!r}")
    if len(logs) > 1 and not args.container:
        names = ", ".join(p.stem for p in logs)
        raise SystemExit(f"error: pod {found['pod']} has containers {names}; choose one with -c")
    path = logs[0]
    out = sys.stdout.buffer
    with open(path, "rb") as f:
        if args.tail is not None:
            lines = f.read().splitlines(keepends=True)[-args.tail :]
            out.write(b"".join(lines))
        else:
            out.write(f.read())
        out.flush()
        idle_since = None
        while args.follow:
            chunk = f.read()
            if chunk:
                out.write(chunk)
                out.flush()
                idle_since = None
                continue
            if not _container_running(state, found["uid"], path.stem):
                idle_since = idle_since or time.monotonic()
                if time.monotonic() - idle_since > 1.0:
                    break
            time.sleep(0.2)
    return 0


def _ps(args: argparse.Namespace) -> int:
    state = Path(args.state_dir)
    infos = running_info(state / "pods")
    from . import netns

    for info in infos:
        info["pids"] = netns.netns_pids(info["netns"]) if info.get("netns") else []
    print(json.dumps(infos, indent=2))
    return 0


def _exec(args: argparse.Namespace) -> int:
    state = Path(args.state_dir)
    matches = [
        i
        for i in running_info(state / "pods")
        if i["pod"] == args.pod
        and (not args.namespace or i["namespace"] == args.namespace)
        and i["containers"]
    ]
    if not matches:
        raise SystemExit(f"error: no running pod named {args.pod!r}")
    containers = matches[0]["containers"]
    pid = containers.get(args.container) if args.container else next(iter(containers.values()))
    if pid is None:
        raise SystemExit(f"error: container {args.container!r} is not running")
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    env = dict(e.decode(errors="replace").split("=", 1) for e in raw if b"=" in e)
    command = args.argv
    return subprocess.call(["nsenter", "-t", str(pid), "-n", "-m", "-u", "--", *command], env=env)


def _cleanup(args: argparse.Namespace) -> int:
    for line in agent_mod.cleanup(Path(args.state_dir)):
        print(f"removed {line}")
    return 0


def _build(_args: argparse.Namespace) -> int:
    print(dns.build())
    return 0


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="nodeagent",
        description=package.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--state-dir",
        default=os.environ.get("NODEAGENT_STATE_DIR", str(DEFAULT_STATE)),
        help="pods, logs and the agent's record [%(default)s]",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="register the nodes and run their pods until SIGTERM")
    run.add_argument("--kubeconfig", help="defaults to $KUBECONFIG")
    run.add_argument("--nodes", type=int, default=2, help="how many nodes [%(default)s]")
    run.add_argument("--node-prefix", default="local-", help="node names [%(default)s0, ...]")
    run.add_argument("--gpus", type=int, default=2, help="nvidia.com/gpu per node [%(default)s]")
    run.add_argument("--cpu", default=str(os.cpu_count() or 2), help="cpu per node [%(default)s]")
    run.add_argument("--memory", default=_total_memory(), help="memory per node [%(default)s]")
    run.add_argument("--subnet", default="10.250.0.0/16", help="pod network [%(default)s]")
    run.add_argument(
        "--no-taint",
        action="store_true",
        help=f"do not taint the nodes {agent_mod.TAINT_KEY}:NoSchedule (any pod may land)",
    )
    run.add_argument(
        "--path-prefix",
        default=str(REPO / ".venv" / "bin"),
        help="put first on every container's PATH (stands in for the image) [%(default)s]",
    )
    run.add_argument(
        "--python-path",
        default=f"{REPO / 'worker'}:{REPO / 'contract'}",
        help="every container's PYTHONPATH: this checkout's worker packages stand in for the "
        "image's ('' for none) [%(default)s]",
    )
    run.add_argument("--ready-file", help="written once the nodes are Ready; removed on exit")
    run.add_argument("-v", "--verbose", action="store_true")
    logs = sub.add_parser("logs", help="print a pod's container log (name or name prefix)")
    logs.add_argument("pod")
    logs.add_argument("-n", "--namespace")
    logs.add_argument("-c", "--container")
    logs.add_argument("-f", "--follow", action="store_true", help="until the container exits")
    logs.add_argument("--tail", type=int)
    sub.add_parser("ps", help="running pods: namespace, netns, IP, pids (JSON)")
    ex = sub.add_parser("exec", help="run a command in a pod's namespaces")
    ex.add_argument("pod")
    ex.add_argument("-n", "--namespace")
    ex.add_argument("-c", "--container")
    ex.add_argument("argv", nargs="+", metavar="-- COMMAND", help="what to run")
    sub.add_parser("cleanup", help="remove what a crashed agent left in --state-dir")
    sub.add_parser("build", help="build CoreDNS (cached) and print its path")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if getattr(args, "verbose", False) else logging.INFO,
        format="%(asctime)s [nodeagent] %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )
    handler = {
        "run": _run,
        "logs": _logs,
        "ps": _ps,
        "exec": _exec,
        "cleanup": _cleanup,
        "build": _build,
    }[args.command]
    sys.exit(handler(args))
