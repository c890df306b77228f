#!/usr/bin/env python3
"""Helpers of the kind end-to-end script (tests/e2e/kind/run.sh), kept in Python so
that the same code is exercised against the local control plane here
(tests/tooling/integration/test_kind_helpers.py), where kind cannot run.

    kind_e2e.py cpu-variant EXAMPLE.yaml --image IMG   print a CPU-only copy of an example
    kind_e2e.py expected EXAMPLE.yaml                  print the phase the example should end in
    kind_e2e.py wait NAME --namespace NS --timeout S   wait for Succeeded/Failed; exit 0 when
                                                       it matches --expect, else dump logs, exit 1
"""

from __future__ import annotations

import argparse
import copy
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

# An example that is meant to fail says so with this annotation; the rest must succeed.
EXPECT_ANNOTATION = "horovod.ai/e2e-expect"
GPU = "nvidia.com/gpu"


def cpu_variant(job: dict[str, Any], image: str, epochs: int = 1) -> dict[str, Any]:
    """The example without GPU requests, on `image`, training for `epochs`.

    kind nodes have no GPUs; the trainers fall back to the CPU (and log it)."""
    job = copy.deepcopy(job)
    spec = job["spec"]
    spec["image"] = image
    resources = spec.get("worker", {}).get("resources") or {}
    for section in ("limits", "requests"):
        if section in resources:
            resources[section].pop(GPU, None)
            if not resources[section]:
                del resources[section]
    if "resources" in spec.get("worker", {}) and not resources:
        del spec["worker"]["resources"]
    spec["command"] = [
        f"--epochs={epochs}" if arg.startswith("--epochs=") else arg for arg in spec["command"]
    ]
    return job


def expected_phase(job: dict[str, Any]) -> str:
    return str(job["metadata"].get("annotations", {}).get(EXPECT_ANNOTATION, "Succeeded"))


def _kubectl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["kubectl", *args], capture_output=True, text=True)


def phase(name: str, namespace: str) -> str | None:
    proc = _kubectl("get", "hvjob", name, "-n", namespace, "-o", "json")
    if proc.returncode != 0:
        return None
    return (json.loads(proc.stdout).get("status") or {}).get("phase")


def dump(name: str, namespace: str) -> None:
    """What a user needs to see when a job did not end as expected."""
    for args in (
        ("get", "hvjob", name, "-n", namespace, "-o", "yaml"),
        ("get", "pods", "-n", namespace, "-l", f"horovod.ai/job-name={name}", "-o", "wide"),
        ("get", "events", "-n", namespace, "--sort-by=.lastTimestamp"),
        ("logs", "-n", namespace, f"job/{name}-launcher", "--tail=200"),
        (
            "logs",
            "-n",
            namespace,
            "-l",
            f"horovod.ai/job-name={name},horovod.ai/role=worker",
            "--tail=100",
            "--prefix",
        ),
    ):
        proc = _kubectl(*args)
        print(f"$ kubectl {' '.join(args)}\n{proc.stdout}{proc.stderr}", file=sys.stderr)


def wait(name: str, namespace: str, expect: str, timeout: float, interval: float = 2) -> bool:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = phase(name, namespace)
        if last in ("Succeeded", "Failed"):
            break
        time.sleep(interval)
    ok = last == expect
    print(f"{namespace}/{name}: {last} (expected {expect})", file=sys.stderr)
    if not ok:
        dump(name, namespace)
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    cpu = sub.add_parser("cpu-variant")
    cpu.add_argument("example", type=Path)
    cpu.add_argument("--image", required=True)
    cpu.add_argument("--epochs", type=int, default=1)
    exp = sub.add_parser("expected")
    exp.add_argument("example", type=Path)
    w = sub.add_parser("wait")
    w.add_argument("name")
    w.add_argument("--namespace", default="default")
    w.add_argument("--expect", default="Succeeded")
    w.add_argument("--timeout", type=float, default=900)
    args = parser.parse_args(argv)
    if args.command == "cpu-variant":
        job = yaml.safe_load(args.example.read_text())
        print(yaml.safe_dump(cpu_variant(job, args.image, args.epochs), sort_keys=False))
        return 0
    if args.command == "expected":
        print(expected_phase(yaml.safe_load(args.example.read_text())))
        return 0
    return 0 if wait(args.name, args.namespace, args.expect, args.timeout) else 1


if __name__ == "__main__":
    sys.exit(main())
