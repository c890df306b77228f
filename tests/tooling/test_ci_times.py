"""hack/ci-times.py (where a CI run's time went) and the Go lane of hack/warm-up.sh."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from localcluster import gobuild
from localcluster.paths import REPO

SCRIPT = REPO / "hack" / "ci-times.py"
JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="5">
<testcase classname="tests.operator.test_decide" name="test_a" time="0.5"/>
<testcase classname="tests.operator.integration.test_kueue" name="test_b" time="120.0"/>
<testcase classname="tests.e2e.test_gloo" name="test_c" time="40.0">
  <failure message="boom">x</failure></testcase>
<testcase classname="tests.worker.training.test_train_pytorch" name="test_d" time="30.0"/>
<testcase classname="tests.worker.images.test_worker_images" name="test_e" time="300.0">
  <skipped message="no docker"/></testcase>
</testsuite></testsuites>
"""


def test_the_report_names_phases_tiers_the_slowest_tests_and_the_warm_up(tmp_path: Path) -> None:
    (tmp_path / "junit.xml").write_text(JUNIT)
    phases = "bootstrap\t1160\t97\nlint\t20\ntests\t4000\t81\ntotal\t5180\n"
    (tmp_path / "phases.tsv").write_text(phases)
    (tmp_path / "warm-up.log").write_text(
        "[warm-up] hack/cluster.sh build kueue ...\n"
        "[warm-up] hack/cluster.sh build kueue: done in 181s\n"
        "[warm-up] hack/images.sh worker tf-gpu: failed (exit 1) after 12s; the tests ...\n"
        "[warm-up]   | #15 ERROR: no active session\n"
        "[warm-up] hack/cluster.sh build volcano ...\n"
    )
    proc = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--phases",
            str(tmp_path / "phases.tsv"),
            "--junit",
            str(tmp_path / "junit.xml"),
            "--warm-up",
            str(tmp_path / "warm-up.log"),
            "--slowest",
            "2",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    out = proc.stdout
    assert re.search(r"bootstrap\s+1160 s  \(CPUs  97 % busy\)", out)
    assert re.search(r"tests\s+4000 s  \(CPUs  81 % busy\)", out)
    assert re.search(r"lint\s+20 s\n", out) and re.search(r"total\s+5180 s", out)
    for tier, count, seconds in (
        ("unit", 1, 0),
        ("integration", 1, 120),
        ("e2e", 1, 40),
        ("training", 1, 30),
        ("images", 1, 300),
    ):
        assert re.search(rf"{tier}\s+{count} tests\s+{seconds} s", out), (tier, out)
    slowest = out.split("slowest tests:")[1].splitlines()[1:3]
    assert "test_worker_images::test_e (skipped)" in slowest[0]
    assert "test_kueue::test_b (passed)" in slowest[1]
    assert "181 s  hack/cluster.sh build kueue (done)" in out
    failed = "12 s  hack/images.sh worker tf-gpu (failed)\n"
    assert failed + "[ci]            | #15 ERROR: no active session\n" in out


def test_a_run_that_stopped_early_still_gets_its_phases(tmp_path: Path) -> None:
    (tmp_path / "phases.tsv").write_text("bootstrap\t30\n")
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--phases", str(tmp_path / "phases.tsv"),
         "--junit", str(tmp_path / "missing.xml")],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert "bootstrap" in proc.stdout and "tier" not in proc.stdout


def test_the_warm_up_builds_only_known_tools_and_every_one_the_tests_build() -> None:
    lane = re.search(r"for tool in ([^;]+); do", (REPO / "hack" / "warm-up.sh").read_text())
    assert lane, "hack/warm-up.sh lost its Go tools loop"
    tools = lane.group(1).replace("\\\n", " ").split()
    known = {t.name for t in gobuild.TOOLS}
    assert set(tools) <= known, set(tools) - known
    # Everything but the control plane (bootstrap builds it) is built ahead.
    assert set(tools) == {t.name for t in gobuild.TOOLS if not t.control_plane} - {"coredns"}
    # The kind node's kubelet first, while the control plane's packages are cached.
    assert tools[0] == "kubernetes-node"


def test_two_junit_files_are_one_report_and_a_missing_one_is_left_out(tmp_path: Path) -> None:
    (tmp_path / "a.xml").write_text(JUNIT)
    (tmp_path / "b.xml").write_text(JUNIT.replace("test_a", "test_f"))
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--junit", str(tmp_path / "a.xml"),
         "--junit", str(tmp_path / "b.xml"), "--junit", str(tmp_path / "missing.xml")],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert re.search(r"unit\s+2 tests", proc.stdout), proc.stdout
    assert re.search(r"integration\s+2 tests\s+240 s", proc.stdout), proc.stdout


def test_the_two_test_streams_split_the_suite_by_one_marker() -> None:
    """hack/test.sh runs `-m stream_b` beside `-m "not stream_b"`: every test in one."""
    script = (REPO / "hack" / "test.sh").read_text()
    assert re.findall(r" -m (\S+)", script) == ["stream_b", '"not']
    assert ' -m "not stream_b" ' in script


def test_stream_b_takes_e2e_docker_and_named_training_modules() -> None:
    from tests.conftest import TRAINING_IN_STREAM_B, in_stream_b

    assert in_stream_b(("e2e", "test_gloo.py"), docker=False)
    assert in_stream_b(("operator", "integration", "test_operator_image.py"), docker=True)
    assert not in_stream_b(("operator", "integration", "test_kueue.py"), docker=False)
    assert not in_stream_b(("operator", "test_decide.py"), docker=False)
    training = REPO / "tests" / "worker" / "training"
    modules = {p.name for p in training.glob("test_*.py")}
    assert modules > TRAINING_IN_STREAM_B, TRAINING_IN_STREAM_B - modules  # no stale name
    for name in modules:
        expected = name in TRAINING_IN_STREAM_B
        assert in_stream_b(("worker", "training", name), docker=False) is expected


def test_failed_tests_come_last_with_the_start_of_their_message(tmp_path: Path) -> None:
    # CI's excerpt keeps a run's last lines: the second stream's failure was cut out of
    # the middle once, so .ci/run lists every failure after the phases.
    (tmp_path / "phases.tsv").write_text("tests\t3000\n")
    long_cause = "run.sh failed: error: loading the images needs room " + "x" * 900
    (tmp_path / "junit-b.xml").write_text(
        '<?xml version="1.0"?><testsuites><testsuite>'
        '<testcase classname="tests.e2e.kind.test_kind_cluster" name="test_k" time="9">'
        f'<failure message="AssertionError: {long_cause}\n  second line">trace</failure>'
        "</testcase>"
        '<testcase classname="tests.a" name="test_fixture" time="1"><error message="">'
        "fixture broke</error></testcase>"
        '<testcase classname="tests.a" name="test_ok" time="1"/>'
        "</testsuite></testsuites>"
    )
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--phases", str(tmp_path / "phases.tsv"),
         "--failed", str(tmp_path / "junit.xml"), "--failed", str(tmp_path / "junit-b.xml")],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    lines = proc.stdout.splitlines()
    start = lines.index("[ci] 2 failed, each with the start of its message:")
    assert lines[start - 1].startswith("[ci]   tests") and len(lines) == start + 5
    assert lines[start + 1] == "[ci]   tests.e2e.kind.test_kind_cluster::test_k"
    message = lines[start + 2]
    assert message.startswith("[ci]     AssertionError: run.sh failed: error: loading")
    assert message.endswith(" [...]") and "second line" not in message
    assert lines[start + 3 :] == ["[ci]   tests.a::test_fixture (error)", "[ci]     fixture broke"]


def test_no_failures_no_section(tmp_path: Path) -> None:
    (tmp_path / "junit.xml").write_text(JUNIT.replace('<failure message="boom">x</failure>', ""))
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--failed", str(tmp_path / "junit.xml")],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert "failed" not in proc.stdout
