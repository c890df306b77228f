"""hvjob: HorovodJobs from the command line (installed as `hvjob` and `kubectl-hvjob`,
so `kubectl hvjob …` works too).

    hvjob submit train.py --workers 4 --gpus 1 -- --epochs 10   run a local script
    hvjob submit -f job.yaml                                    or a manifest
    hvjob list | describe NAME | logs NAME [-f] [--rank R] | wait NAME | delete NAME
    hvjob convert mpijob.yaml > horovodjob.yaml                 from a kubeflow MPIJob
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from .client import FINISHED, HorovodJobClient, JobError, progress_summary, summary
from .convert import ConvertError, convert
from .submit import SubmitError, owned_by, script_job

# Kubernetes object names: the job name doubles as a DNS label prefix for its pods.
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _job_name(raw: str) -> str:
    if not _NAME.match(raw):
        raise argparse.ArgumentTypeError(
            f"{raw!r} is not a valid job name: lowercase letters, digits and '-', "
            "starting and ending with a letter or digit"
        )
    return raw


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hvjob", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("-n", "--namespace", default="default")
    parser.add_argument("--kubeconfig", default=None)
    parser.add_argument("--context", default=None)
    sub = parser.add_subparsers(dest="command", required=True)

    submit = sub.add_parser("submit", help="run a local script (or -f a manifest)")
    submit.add_argument("script", nargs="?", type=Path, help="a Python training script")
    submit.add_argument("args", nargs=argparse.REMAINDER, help="arguments after --")
    submit.add_argument("-f", "--filename", type=Path, help="a HorovodJob manifest instead")
    submit.add_argument("--name", type=_job_name, help="job name [the script's, e.g. train]")
    submit.add_argument("--workers", type=int, default=1, help="worker pods [1]")
    submit.add_argument("--gpus", type=int, default=0, help="GPUs per worker [0]")
    submit.add_argument("--slots", type=int, default=None, help="ranks per worker [--gpus or 1]")
    submit.add_argument("--image", default="", help="worker image [the operator's default]")
    submit.add_argument("--wait", action="store_true", help="wait until it finishes")
    submit.add_argument("--timeout", type=float, default=3600)

    sub.add_parser("list", help="jobs of the namespace")
    describe = sub.add_parser("describe", help="status, failures and events of a job")
    describe.add_argument("name")
    logs = sub.add_parser("logs", help="the launcher's output, by rank")
    logs.add_argument("name")
    logs.add_argument("-f", "--follow", action="store_true")
    logs.add_argument("--rank", type=int, default=None, help="only this rank's lines")
    wait = sub.add_parser("wait", help="wait for a phase, printing progress")
    wait.add_argument("name")
    wait.add_argument("--for", dest="phases", default=",".join(FINISHED))
    wait.add_argument("--timeout", type=float, default=3600)
    delete = sub.add_parser("delete", help="delete a job and its pods")
    delete.add_argument("name")
    delete.add_argument("--wait", action="store_true")
    conv = sub.add_parser("convert", help="a kubeflow MPIJob manifest as a HorovodJob")
    conv.add_argument("filename", type=Path, help="the MPIJob YAML ('-': standard input)")
    return parser


def _convert(filename: Path) -> int:
    text = sys.stdin.read() if str(filename) == "-" else filename.read_text()
    job, warnings = convert(yaml.safe_load(text))
    for warning in warnings:
        _say(f"warning: {warning}")
    print(yaml.safe_dump(job, sort_keys=False), end="")
    return 0


def _submit(jobs: HorovodJobClient, args: argparse.Namespace) -> int:
    if args.filename:
        manifest: dict[str, Any] = yaml.safe_load(args.filename.read_text())
        created = jobs.create(manifest)
    else:
        if args.script is None:
            raise SubmitError("give a script (hvjob submit train.py) or -f MANIFEST")
        extra = args.args[1:] if args.args[:1] == ["--"] else args.args
        name = args.name or _job_name(args.script.stem.lower().replace("_", "-"))
        configmap, manifest = script_job(
            name,
            args.script,
            extra,
            workers=args.workers,
            gpus=args.gpus,
            slots=args.slots,
            image=args.image,
        )
        created = jobs.create(manifest)
        try:
            jobs.create_configmap(owned_by(configmap, created))
        except JobError:
            # No half-created job: without its script the workers would wait forever.
            jobs.delete(created["metadata"]["name"])
            raise
    name = created["metadata"]["name"]
    _say(f"horovodjob/{name} created in {jobs.namespace}")
    if not args.wait:
        _say(f"follow it: hvjob logs {name} -f -n {jobs.namespace}")
        return 0
    done = jobs.wait(name, timeout=args.timeout, progress=_say)
    return 0 if done["status"]["phase"] == "Succeeded" else 1


def _describe(jobs: HorovodJobClient, name: str) -> None:
    job = jobs.get(name)
    status = job.get("status") or {}
    print(summary(job))
    training = progress_summary(status)
    if training:
        print(f"  progress: {training}")
    hung = (status.get("progress") or {}).get("hung")
    if hung:
        print(f"  hung at {hung.get('time')}: {hung.get('message')}")
    for failure in status.get("failures") or []:
        print(
            f"  failed: pod {failure.get('pod')} container {failure.get('container')} "
            f"exit {failure.get('exitCode')} ({failure.get('reason')})"
        )
        for line in str(failure.get("message") or "").splitlines()[-5:]:
            print(f"    {line}")
    for condition in status.get("conditions") or []:
        print(
            f"  {condition['type']}={condition['status']} {condition.get('reason', '')}: "
            f"{condition.get('message', '')}"
        )
    for event in jobs.events(name):
        print(f"  event {event.get('type')} {event.get('reason')}: {event.get('message')}")


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "convert":
        try:
            return _convert(args.filename)
        except (ConvertError, OSError, yaml.YAMLError) as error:
            _say(f"error: {error}")
            return 1
    try:
        jobs = HorovodJobClient(args.namespace, kubeconfig=args.kubeconfig, context=args.context)
        if args.command == "submit":
            return _submit(jobs, args)
        if args.command == "list":
            for job in jobs.list_jobs():
                print(summary(job))
        elif args.command == "describe":
            _describe(jobs, args.name)
        elif args.command == "logs":
            for rank, line in jobs.logs(args.name, follow=args.follow, rank=args.rank):
                print(line if args.rank is not None or rank is None else f"[{rank}] {line}")
        elif args.command == "wait":
            phases = [p.strip() for p in args.phases.split(",") if p.strip()]
            done = jobs.wait(args.name, phases, timeout=args.timeout, progress=_say)
            print(json.dumps((done.get("status") or {}).get("phase")))
        elif args.command == "delete":
            jobs.delete(args.name, wait=args.wait)
            _say(f"horovodjob/{args.name} deleted")
    except (JobError, SubmitError) as error:
        _say(f"error: {error}")
        return 1
    return 0


def run() -> None:
    sys.exit(main())
