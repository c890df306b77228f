"""`hack/cluster.sh` (python -m localcluster): build, start, inspect and stop the
local control plane."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from . import cluster, gobuild
from .cluster import DEFAULT_DIR, DEFAULT_PORT_BASE, Cluster, ClusterError, Layout
from .pki import PkiError


def _layout_from_args(args: argparse.Namespace) -> Layout:
    root = Path(args.dir).resolve()
    if (root / "layout.json").exists() and args.command != "up":
        return Layout.load(root)
    return Layout(
        root=root,
        port_base=args.port_base,
        kwok_nodes=args.nodes,
        node_gpus=args.gpus,
        audit=args.audit,
    )


@contextlib.contextmanager
def _errors() -> Iterator[None]:
    try:
        yield
    except (ClusterError, gobuild.BuildError, PkiError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="hack/cluster.sh",
        description=cluster.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "command", choices=["build", "up", "down", "status", "env", "set-pod-phase"]
    )
    parser.add_argument(
        "args", nargs="*", help="set-pod-phase: NAMESPACE POD PHASE [EXIT_CODE [REASON]]"
    )
    parser.add_argument(
        "--dir",
        default=os.environ.get("HVK_DIR", str(DEFAULT_DIR)),
        help="state directory (kubeconfig, logs, pids) [%(default)s]",
    )
    parser.add_argument(
        "--port-base",
        type=int,
        default=int(os.environ.get("HVK_PORT_BASE", DEFAULT_PORT_BASE)),
        help="first of the 127.0.0.1 ports the cluster uses [%(default)s]",
    )
    parser.add_argument(
        "--nodes",
        type=int,
        default=int(os.environ.get("HVK_KWOK_NODES", 4)),
        help="kwok GPU nodes to register [%(default)s]",
    )
    parser.add_argument(
        "--gpus",
        type=int,
        default=int(os.environ.get("HVK_NODE_GPUS", 8)),
        help="nvidia.com/gpu capacity of each kwok node [%(default)s]",
    )
    parser.add_argument(
        "--audit",
        action="store_true",
        help="write the API server's audit log to <dir>/logs/audit.log (the benchmark reads it)",
    )
    args = parser.parse_args(argv)
    with _errors():
        if args.command == "build":
            gobuild.build(args.args)
            return
        local = Cluster(_layout_from_args(args))
        if args.command == "up":
            gobuild.build()
            local.up()
        elif args.command == "down":
            local.down()
        elif args.command == "status":
            st = local.status()
            print(json.dumps(st, indent=2))
            sys.exit(0 if st["apiserver_ready"] else 1)
        elif args.command == "env":
            print(f"export KUBECONFIG={local.layout.kubeconfig}")
            print(f"export PATH={local.layout.bin}:$PATH")
        elif args.command == "set-pod-phase":
            ns, pod, phase, *rest = args.args
            local.set_pod_phase(
                ns, pod, phase, int(rest[0]) if rest else 0, rest[1] if len(rest) > 1 else None
            )


if __name__ == "__main__":
    main()
