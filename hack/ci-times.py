#!/usr/bin/env python3
"""Where a CI run's time went: the phases .ci/run timed, each test tier and the
slowest tests from pytest's junit file, and the warm-up's steps.

    hack/ci-times.py [--phases .work/ci/phases.tsv] [--junit .work/ci/junit.xml ...]
        [--warm-up .work/warm-up.log] [--slowest 15] [--failed .work/ci/junit.xml ...]

--junit may come more than once (hack/test.sh runs two pytest streams); a file
that does not exist is left out. --failed (also repeated) names the junit files
whose failed tests are listed last, each with the start of its message: CI's
excerpt of a run keeps its first and last lines, and a failure in the middle of
the second stream's log was cut out of it (the run of e709365, 2026-12-06).

phases.tsv: one `<phase>\t<seconds>[\t<percent of the CPUs busy>]` line per phase, in
order (.ci/run writes it).
Standard library only: it runs after any failure, whatever was installed.
"""

from __future__ import annotations

import argparse
import re
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

# The tiers of tests/conftest.py, by where a test lives.
TIERS = ("unit", "integration", "e2e", "training", "images")


def tier_of(classname: str) -> str:
    """junit's classname is the test's module path with dots (tests.e2e.test_x)."""
    parts = classname.split(".")
    if len(parts) > 1 and parts[1] == "e2e":
        return "e2e"
    for tier in ("images", "training", "integration"):
        if tier in parts[:-1]:
            return tier
    return "unit"


def read_junit(path: Path) -> list[tuple[str, str, float, str]]:
    """(tier, test id, seconds, outcome) per test case."""
    cases = []
    for case in ET.parse(path).iter("testcase"):
        classname = case.get("classname", "")
        seconds = float(case.get("time") or 0)
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed"}.get(child.tag, child.tag)
        cases.append((tier_of(classname), f"{classname}::{case.get('name')}", seconds, outcome))
    return cases


# How much of a failure's message is kept: the tests put the cause first.
MESSAGE_CHARS = 600


def read_failures(path: Path) -> list[tuple[str, str]]:
    """(test id, the start of its message on one line) of each failed or erroring test."""
    failures = []
    for case in ET.parse(path).iter("testcase"):
        for child in case:
            if child.tag in ("failure", "error"):
                text = child.get("message") or (child.text or "").strip() or child.tag
                folded = " ".join(text.split())
                if len(folded) > MESSAGE_CHARS:
                    folded = folded[:MESSAGE_CHARS] + " [...]"
                name = f"{case.get('classname', '')}::{case.get('name')}"
                failures.append((f"{name} ({child.tag})" if child.tag == "error" else name, folded))
    return failures


def read_phases(path: Path) -> list[tuple[str, int, int | None]]:
    """(phase, seconds, percent of the CPUs busy or None) per line."""
    rows: list[tuple[str, int, int | None]] = []
    for line in path.read_text().splitlines():
        name, _, rest = line.partition("\t")
        seconds, _, busy = rest.partition("\t")
        if seconds.strip().isdigit():
            rows.append((name, int(seconds), int(busy) if busy.strip().isdigit() else None))
    return rows


WARM_STEP = re.compile(r"^\[warm-up\] (.+): (done in|failed \(exit \d+\) after) (\d+)s")


# The last lines of a failed step's output, repeated after its "failed" line.
WARM_TAIL = "[warm-up]   | "


def read_warm_up(path: Path) -> list[tuple[str, str, int, list[str]]]:
    """(step, outcome, seconds, the last lines of its output when it failed) of each
    step, in the order they ended."""
    steps: list[tuple[str, str, int, list[str]]] = []
    for line in path.read_text(errors="replace").splitlines():
        found = WARM_STEP.match(line)
        if found:
            outcome = "done" if found.group(2) == "done in" else "failed"
            steps.append((found.group(1), outcome, int(found.group(3)), []))
        elif line.startswith(WARM_TAIL) and steps and steps[-1][1] == "failed":
            steps[-1][3].append(line[len(WARM_TAIL) :])
    return steps


def report(
    phases: list[tuple[str, int, int | None]],
    cases: list[tuple[str, str, float, str]],
    warm: list[tuple[str, str, int, list[str]]],
    slowest: int,
) -> str:
    out = ["[ci] time per phase:"] if phases else []
    out += [
        f"[ci]   {name:<28} {seconds:>6} s" + ("" if busy is None else f"  (CPUs {busy:>3} % busy)")
        for name, seconds, busy in phases
    ]
    if cases:
        by_tier: dict[str, list[float]] = defaultdict(list)
        for tier, _, seconds, _ in cases:
            by_tier[tier].append(seconds)
        out.append("[ci] tests per tier (setup, call and teardown):")
        for tier in TIERS:
            if tier in by_tier:
                times = by_tier[tier]
                out.append(f"[ci]   {tier:<12} {len(times):>4} tests {sum(times):>8.0f} s")
        out.append(f"[ci] the {slowest} slowest tests:")
        for tier, name, seconds, outcome in sorted(cases, key=lambda c: -c[2])[:slowest]:
            out.append(f"[ci]   {seconds:>7.1f} s  {tier:<11} {name} ({outcome})")
    if warm:
        out.append("[ci] warm-up steps (beside the tests, idle priority):")
        for step, outcome, seconds, tail in warm:
            out.append(f"[ci]   {seconds:>6} s  {step} ({outcome})")
            out += [f"[ci]            | {line}" for line in tail]
    return "\n".join(out)


def report_failures(failures: list[tuple[str, str]]) -> str:
    if not failures:
        return ""
    out = [f"[ci] {len(failures)} failed, each with the start of its message:"]
    for name, message in failures:
        out += [f"[ci]   {name}", f"[ci]     {message}"]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--phases", type=Path)
    parser.add_argument("--junit", type=Path, action="append", default=[])
    parser.add_argument("--warm-up", type=Path)
    parser.add_argument("--slowest", type=int, default=15)
    parser.add_argument("--failed", type=Path, action="append", default=[])
    args = parser.parse_args(argv)
    phases = read_phases(args.phases) if args.phases and args.phases.exists() else []
    cases = [case for path in args.junit if path.exists() for case in read_junit(path)]
    warm = read_warm_up(args.warm_up) if args.warm_up and args.warm_up.exists() else []
    text = report(phases, cases, warm, args.slowest)
    failures = [f for path in args.failed if path.exists() for f in read_failures(path)]
    print("\n".join(part for part in (text, report_failures(failures)) if part))
    return 0


if __name__ == "__main__":
    sys.exit(main())
