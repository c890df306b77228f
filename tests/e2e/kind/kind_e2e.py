#!/usr/bin/env python3
"""Helpers of the kind end-to-end script (tests/e2e/kind/run.sh), kept in Python so
that the same code is exercised against the local control plane here
(tests/tooling/integration/test_kind_helpers.py), where kind cannot run.

    kind_e2e.py cpu-variant EXAMPLE.yaml --image IMG   print a CPU-only copy of an example
    kind_e2e.py failing-variant EXAMPLE.yaml --image IMG
                                                       print a copy whose trainer refuses an
                                                       argument (the job must fail, saying so)
    kind_e2e.py failing-name EXAMPLE.yaml              the name that copy gets
    kind_e2e.py expected EXAMPLE.yaml                  print the phase the example should end in
    kind_e2e.py name EXAMPLE.yaml                      print the name of the example's HorovodJob
    kind_e2e.py volumes EXAMPLE.yaml --class SC        print a PersistentVolume for each claim
                                                       of the example (kind ships no provisioner)
    kind_e2e.py wait NAME --namespace NS --timeout S   wait for Succeeded/Failed; exit 0 when
                                                       it matches --expect (and --reason), else
                                                       dump logs, exit 1
    kind_e2e.py operator-ready --namespace NS          wait until an operator replica leads
    kind_e2e.py timings NAME --record FILE             seconds from apply to the trainers'
                                                       start and to the end, added to FILE
"""

from __future__ import annotations

import argparse
import copy
import json
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

# An example that is meant to fail says so with this annotation; the rest must succeed.
EXPECT_ANNOTATION = "horovod.ai/e2e-expect"
# Text the status of a failed job must show (its message, a condition's or a failure's).
EXPECT_TEXT_ANNOTATION = "horovod.ai/e2e-expect-text"
GPU = "nvidia.com/gpu"
# The line each rank prints once Horovod is initialised, right before its first
# step (horovod_contract.RANK_PREFIX; this script runs without the package).
RANK_PREFIX = "HVJOB_RANK"
REFUSED_DATASET = "no-such-dataset"


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


def horovod_job(documents: list[dict[str, Any]]) -> dict[str, Any]:
    """The HorovodJob of an example (the others are what it uses: a ConfigMap, a claim)."""
    return next(d for d in documents if d.get("kind") == "HorovodJob")


def with_job(documents: list[dict[str, Any]], job: dict[str, Any]) -> list[dict[str, Any]]:
    return [job if d.get("kind") == "HorovodJob" else d for d in documents]


# Where the PersistentVolumes for examples' claims live on the kind node.
VOLUME_ROOT = "/var/local/hvjob-volumes"


def volume_path(claim: str) -> str:
    return f"{VOLUME_ROOT}/{claim}"


def volumes_for_claims(
    documents: list[dict[str, Any]], storage_class: str, namespace: str = "default"
) -> list[dict[str, Any]]:
    """A hostPath PersistentVolume bound ahead to each claim of the example: what a
    provisioner would make (kind's node image ships none). Same class and size
    as the claim asks, so the binder takes it."""
    volumes = []
    for claim in (d for d in documents if d.get("kind") == "PersistentVolumeClaim"):
        name = claim["metadata"]["name"]
        volumes.append(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": f"{namespace}-{name}"},
                "spec": {
                    "capacity": {"storage": claim["spec"]["resources"]["requests"]["storage"]},
                    "accessModes": claim["spec"]["accessModes"],
                    "storageClassName": claim["spec"].get("storageClassName", storage_class),
                    "persistentVolumeReclaimPolicy": "Delete",
                    "claimRef": {"namespace": namespace, "name": name},
                    "hostPath": {"path": volume_path(name), "type": "Directory"},
                },
            }
        )
    return volumes


def failing_name(job: dict[str, Any]) -> str:
    return f"{job['metadata']['name']}-refused-argument"


def failing_variant(job: dict[str, Any], image: str) -> dict[str, Any]:
    """A CPU copy whose trainer refuses its --dataset on every rank, with no retry:
    the job must fail and its status must carry the trainer's own words."""
    job = cpu_variant(job, image)
    job["metadata"]["name"] = failing_name(job)
    annotations = job["metadata"].setdefault("annotations", {})
    annotations[EXPECT_ANNOTATION] = "Failed"
    annotations[EXPECT_TEXT_ANNOTATION] = REFUSED_DATASET
    job["spec"]["command"] = [
        f"--dataset={REFUSED_DATASET}" if arg.startswith("--dataset=") else arg
        for arg in job["spec"]["command"]
    ]
    job["spec"].setdefault("runPolicy", {})["backoffLimit"] = 0
    return job


def expected_phase(job: dict[str, Any]) -> str:
    return str(job["metadata"].get("annotations", {}).get(EXPECT_ANNOTATION, "Succeeded"))


def _kubectl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["kubectl", *args], capture_output=True, text=True)


def get_job(name: str, namespace: str) -> dict[str, Any] | None:
    proc = _kubectl("get", "hvjob", name, "-n", namespace, "-o", "json")
    if proc.returncode != 0:
        return None
    job: dict[str, Any] = json.loads(proc.stdout)
    return job


def phase(name: str, namespace: str) -> str | None:
    job = get_job(name, namespace)
    return None if job is None else (job.get("status") or {}).get("phase")


def status_text(status: dict[str, Any]) -> str:
    """Everything a user reads in a job's status: message, conditions, failures."""
    parts = [str(status.get("message", ""))]
    parts += [str(c.get("message", "")) for c in status.get("conditions") or []]
    parts += [str(f.get("message", "")) for f in status.get("failures") or []]
    return "\n".join(parts)


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


def wait(
    name: str,
    namespace: str,
    expect: str,
    timeout: float,
    interval: float = 2,
    reason: str = "",
    rank_line: Path | None = None,
) -> bool:
    """Wait for the job to finish; whether it ended as expected: the phase, the
    reason when given, and the text its manifest's annotation asks for. Into
    `rank_line`, the rank start lines as soon as a pod prints them (kept until
    rank 0's is among them)."""
    deadline = time.monotonic() + timeout
    job: dict[str, Any] | None = None
    last = None
    while time.monotonic() < deadline:
        job = get_job(name, namespace)
        last = None if job is None else (job.get("status") or {}).get("phase")
        if last in ("Succeeded", "Failed"):
            break
        if job is not None and rank_line is not None and _rank0(_kept(rank_line)) is None:
            lines = rank_lines(name, namespace, job)
            if lines:
                rank_line.write_text("\n".join(lines) + "\n")
        time.sleep(interval)
    status = (job or {}).get("status") or {}
    problems = [] if last == expect else [f"phase {last}, expected {expect}"]
    if reason and status.get("reason") != reason:
        problems.append(f"reason {status.get('reason')!r}, expected {reason!r}")
    text = ((job or {}).get("metadata", {}).get("annotations") or {}).get(EXPECT_TEXT_ANNOTATION)
    if text and text not in status_text(status):
        problems.append(f"the status does not say {text!r}")
    verdict = "; ".join(problems) or "as expected"
    print(
        f"{namespace}/{name}: {last} ({status.get('reason')}: "
        f"{str(status.get('message', ''))[:300]}) -- {verdict}",
        file=sys.stderr,
    )
    if problems:
        dump(name, namespace)
    return not problems


def operator_ready(namespace: str, timeout: float, interval: float = 2) -> bool:
    """True once a replica holds the leader Lease: the chart's operator acts."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        proc = _kubectl("get", "leases", "-n", namespace, "-o", "json")
        if proc.returncode == 0:
            for lease in json.loads(proc.stdout).get("items", []):
                holder = (lease.get("spec") or {}).get("holderIdentity")
                if holder:
                    print(f"operator leader: {holder}", file=sys.stderr)
                    return True
        time.sleep(interval)
    print(f"no operator replica took the lease in {namespace} within {timeout}s", file=sys.stderr)
    return False


def _parse_time(text: str) -> datetime:
    # Kubernetes writes RFC 3339 with Z; log timestamps carry nanoseconds.
    text = text.replace("Z", "+00:00")
    if "." in text:
        head, tail = text.split(".", 1)
        digits = tail[: len(tail) - len(tail.lstrip("0123456789"))]
        zone = tail[len(digits) :]
        text = f"{head}.{digits[:6]}{zone}"
    return datetime.fromisoformat(text)


def rank_lines(name: str, namespace: str, job: dict[str, Any]) -> list[str]:
    """The rank start lines, with their timestamps, from the pod that printed rank 0's
    (none while no rank has started, or once the pods are gone).

    mpi mode: horovodrun on the launcher gathers every rank's output; gloo mode:
    each worker prints its own ranks' (worker-0 holds rank 0; in an elastic job,
    the first worker the launcher found Ready)."""
    text = _kubectl("logs", "-n", namespace, f"job/{name}-launcher", "--timestamps").stdout
    if f"{RANK_PREFIX} rank=" not in text:
        spec = job.get("spec") or {}
        workers = (spec.get("elastic") or {}).get("maxReplicas") or 1
        for index in range(workers):
            pod = f"pod/{name}-worker-{index}"
            text = _kubectl("logs", "-n", namespace, pod, "--timestamps").stdout
            if f"{RANK_PREFIX} rank=0 " in text:
                break
    # horovodrun prefixes each rank's line: "[1,0]<stdout>:HVJOB_RANK rank=0 ..."
    return [line for line in text.splitlines() if f"{RANK_PREFIX} rank=" in line]


def _rank0(lines: list[str]) -> str | None:
    return next((line for line in lines if f"{RANK_PREFIX} rank=0 " in line), None)


def _kept(path: Path | None) -> list[str]:
    if path is None or not path.exists():
        return []
    return [line for line in path.read_text().splitlines() if line.strip()]


def _seconds_after(created: datetime, line: str) -> float:
    return round((_parse_time(line.partition(" ")[0]) - created).total_seconds(), 1)


def timings(name: str, namespace: str, seen: Path | None = None) -> dict[str, Any]:
    """Seconds from the job's creation to its first rank's start line (Horovod is
    initialised and the first step is next), to rank 0's and to its completion. The
    lines are read from the pods now, or else from `seen`, where `wait` kept them
    while the job ran (an elastic job's finished workers may be cleaned up by then)."""
    job = get_job(name, namespace) or {}
    created = _parse_time(job["metadata"]["creationTimestamp"])
    status = job.get("status") or {}
    result: dict[str, Any] = {"phase": status.get("phase")}
    # The live lines unless they lack rank 0's and `wait` kept it: the pod that printed
    # it may be gone while others are not (CI's run of b7c3a58: the elastic job's
    # worker-0 was cleaned up, another worker's lines were read, rank 0 went missing).
    lines = rank_lines(name, namespace, job)
    kept = _kept(seen)
    if _rank0(lines) is None and kept:
        lines = kept
    if lines:
        result["apply_to_trainers_started_s"] = _seconds_after(created, lines[0])
    rank0 = _rank0(lines)
    if rank0 is not None:
        result["apply_to_rank0_started_s"] = _seconds_after(created, rank0)
    if status.get("firstStepTime"):
        # The operator's own reading of rank 0's line (its first_step watcher, through
        # the chart's RBAC), cut to the second: should agree with the one above.
        result["apply_to_first_step_s"] = round(
            (_parse_time(status["firstStepTime"]) - created).total_seconds(), 1
        )
    if status.get("completionTime"):
        result["apply_to_finished_s"] = round(
            (_parse_time(status["completionTime"]) - created).total_seconds(), 1
        )
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    cpu = sub.add_parser("cpu-variant")
    cpu.add_argument("example", type=Path)
    cpu.add_argument("--image", required=True)
    cpu.add_argument("--epochs", type=int, default=1)
    failing = sub.add_parser("failing-variant")
    failing.add_argument("example", type=Path)
    failing.add_argument("--image", required=True)
    sub.add_parser("failing-name").add_argument("example", type=Path)
    exp = sub.add_parser("expected")
    exp.add_argument("example", type=Path)
    sub.add_parser("name").add_argument("example", type=Path)
    vols = sub.add_parser("volumes")
    vols.add_argument("example", type=Path)
    vols.add_argument("--class", dest="storage_class", default="")
    w = sub.add_parser("wait")
    w.add_argument("name")
    w.add_argument("--namespace", default="default")
    w.add_argument("--expect", default="Succeeded")
    w.add_argument("--reason", default="")
    w.add_argument("--timeout", type=float, default=900)
    w.add_argument("--rank-line", type=Path, help="where to keep the rank start lines")
    ready = sub.add_parser("operator-ready")
    ready.add_argument("--namespace", required=True)
    ready.add_argument("--timeout", type=float, default=120)
    times = sub.add_parser("timings")
    times.add_argument("name")
    times.add_argument("--namespace", default="default")
    times.add_argument("--record", type=Path, required=True)
    times.add_argument("--rank-line", type=Path, help="the line `wait --rank-line` kept")
    args = parser.parse_args(argv)
    if args.command in ("cpu-variant", "failing-variant", "failing-name", "expected", "name"):
        documents = [d for d in yaml.safe_load_all(args.example.read_text()) if d]
        job = horovod_job(documents)
        if args.command == "cpu-variant":
            variant = with_job(documents, cpu_variant(job, args.image, args.epochs))
            print(yaml.safe_dump_all(variant, sort_keys=False))
        elif args.command == "failing-variant":
            print(yaml.safe_dump(failing_variant(job, args.image), sort_keys=False))
        elif args.command == "failing-name":
            print(failing_name(job))
        elif args.command == "name":
            print(job["metadata"]["name"])
        else:
            print(expected_phase(job))
        return 0
    if args.command == "volumes":
        documents = [d for d in yaml.safe_load_all(args.example.read_text()) if d]
        volumes = volumes_for_claims(documents, args.storage_class)
        if volumes:
            print(yaml.safe_dump_all(volumes, sort_keys=False))
        return 0
    if args.command == "operator-ready":
        return 0 if operator_ready(args.namespace, args.timeout) else 1
    if args.command == "timings":
        recorded = json.loads(args.record.read_text()) if args.record.exists() else {}
        recorded[args.name] = timings(args.name, args.namespace, args.rank_line)
        args.record.write_text(json.dumps(recorded, indent=2, sort_keys=True) + "\n")
        print(f"{args.name}: {recorded[args.name]}", file=sys.stderr)
        return 0
    ok = wait(
        args.name,
        args.namespace,
        args.expect,
        args.timeout,
        reason=args.reason,
        rank_line=args.rank_line,
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
