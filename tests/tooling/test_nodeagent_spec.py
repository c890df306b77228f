"""The node agent without a cluster: its pure kubelet rules (spec.py) and its start checks."""

from __future__ import annotations

import base64
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest

from horovod_operator.training_log import read
from localcluster.nodeagent import mounts, probes, spec
from localcluster.nodeagent.agent import netns_prefix
from localcluster.nodeagent.logserver import LogClock, format_stamp
from localcluster.nodeagent.netns import list_netns
from localcluster.nodeagent.spec import ContainerState
from localcluster.paths import WORK
from tests.support.nodeagent import AGENT
from tests.support.prerequisites import skip_unless_ci

POD: dict[str, Any] = {
    "metadata": {"name": "w-0", "namespace": "ns", "uid": "u1", "labels": {"app": "a"}},
    "spec": {
        "nodeName": "local-0",
        "hostname": "job-worker-0",
        "subdomain": "job-worker",
        "containers": [
            {"name": "main", "resources": {"limits": {"cpu": "1500m", "memory": "1Gi"}}}
        ],
    },
}


def _env(container: dict[str, Any], data: dict[str, dict[str, str]] | None = None) -> Any:
    return spec.container_env(
        POD,
        container,
        pod_ip="10.250.0.7",
        host_ip="127.0.0.1",
        node_allocatable={"cpu": "8", "memory": "16Gi"},
        lookup=lambda kind, name: (data or {}).get(f"{kind}/{name}"),
        base={"PATH": "/venv/bin:/usr/bin"},
    )


def test_env_sources_in_order() -> None:
    container = {
        "name": "main",
        "resources": {"limits": {"cpu": "1500m", "memory": "1Gi"}},
        "envFrom": [{"configMapRef": {"name": "cm"}, "prefix": "CM_"}],
        "env": [
            {"name": "A", "value": "a"},
            {"name": "B", "value": "$(A)-$(NOPE)-$$(A)"},
            {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
            {"name": "CPU", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
            {
                "name": "MEM_MI",
                "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}},
            },
            {
                "name": "REQ_MEM",
                "valueFrom": {"resourceFieldRef": {"resource": "requests.memory"}},
            },
            {"name": "S", "valueFrom": {"secretKeyRef": {"name": "sec", "key": "k"}}},
        ],
    }
    env = _env(container, {"configMapRef/cm": {"X": "1"}, "secretRef/sec": {"k": "v"}})
    assert env == {
        "PATH": "/venv/bin:/usr/bin",
        "CM_X": "1",
        "A": "a",
        "B": "a-$(NOPE)-$(A)",
        "POD": "w-0",
        "IP": "10.250.0.7",
        "APP": "a",
        "CPU": "2",  # 1.5 cores round up, as the kubelet does
        "MEM_MI": "1024",
        "REQ_MEM": str(2**30),  # requests fall back to limits
        "S": "v",
    }


def test_missing_reference_is_an_error_unless_optional() -> None:
    ref = {"secretKeyRef": {"name": "nope", "key": "k"}}
    with pytest.raises(ValueError, match="nope"):
        _env({"name": "main", "env": [{"name": "S", "valueFrom": ref}]})
    optional = {"secretKeyRef": {"name": "nope", "key": "k", "optional": True}}
    assert "S" not in _env({"name": "main", "env": [{"name": "S", "valueFrom": optional}]})


def test_command_line_expands_and_needs_a_command() -> None:
    container = {"name": "c", "command": ["sh", "-c"], "args": ["echo $(A)"]}
    assert spec.command_line(container, {"A": "x"}) == ["sh", "-c", "echo x"]
    with pytest.raises(ValueError, match="no command"):
        spec.command_line({"name": "c"}, {})


def test_secret_and_config_map_files_and_modes() -> None:
    secret = {"data": {k: base64.b64encode(v.encode()).decode() for k, v in {"a": "1"}.items()}}
    files = spec.secret_files(secret, {"secretName": "s", "defaultMode": 0o600})
    assert files == [spec.VolumeFile("a", b"1", 0o600)]
    config_map = {"data": {"hostfile": "h slots=1", "run.sh": "echo"}}
    source = {
        "name": "c",
        "items": [
            {"key": "hostfile", "path": "hostfile"},
            {"key": "run.sh", "path": "bin/run.sh", "mode": 0o755},
        ],
    }
    assert spec.config_map_files(config_map, source) == [
        spec.VolumeFile("hostfile", b"h slots=1", 0o644),
        spec.VolumeFile("bin/run.sh", b"echo", 0o755),
    ]
    assert spec.secret_files(None, {"secretName": "s", "optional": True}) == []
    with pytest.raises(ValueError, match="not found"):
        spec.config_map_files(None, {"name": "c"})


def test_hosts_and_resolv_conf_like_a_kubelet() -> None:
    hosts = spec.hosts_file(POD, "10.250.0.7")
    assert "10.250.0.7\tjob-worker-0.job-worker.ns.svc.cluster.local\tjob-worker-0\n" in hosts
    assert spec.resolv_conf("ns", "10.250.0.1") == (
        "nameserver 10.250.0.1\nsearch ns.svc.cluster.local svc.cluster.local cluster.local\n"
        "options ndots:5\n"
    )


@pytest.mark.parametrize(
    ("policy", "codes", "phase"),
    [
        ("Never", [0, 0], "Succeeded"),
        ("Never", [0, 3], "Failed"),
        ("OnFailure", [0, 3], "Running"),
        ("Always", [0, 0], "Succeeded"),
        ("Never", [None, 0], "Running"),
    ],
)
def test_pod_phase(policy: str, codes: list[int | None], phase: str) -> None:
    states = []
    for i, code in enumerate(codes):
        state = ContainerState(name=f"c{i}", started_at="t")
        state.state = "running" if code is None else "terminated"
        state.exit_code = code
        states.append(state)
    assert spec.pod_phase(policy, True, False, states) == phase


def test_pod_phase_before_and_after_init() -> None:
    waiting = [ContainerState(name="c")]
    assert spec.pod_phase("Never", False, False, waiting) == "Pending"
    assert spec.pod_phase("Never", False, True, waiting) == "Failed"
    assert spec.pod_phase("OnFailure", False, True, waiting) == "Pending"


@pytest.mark.parametrize(
    ("pod_context", "context", "expected"),
    [
        ({}, {}, spec.RunAs(0, 0, (), False, False)),
        # runAsNonRoot without a user: the worker image's user stands in for the image's.
        (
            {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
            {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
            spec.RunAs(1000, 1000, (), True, True),
        ),
        # The container's settings win over the pod's; fsGroup joins the groups.
        (
            {"runAsUser": 2000, "runAsGroup": 3000, "fsGroup": 4000, "supplementalGroups": [5]},
            {"runAsUser": 2500},
            spec.RunAs(2500, 3000, (5, 4000), False, False),
        ),
    ],
)
def test_run_as(pod_context: dict[str, Any], context: dict[str, Any], expected: Any) -> None:
    pod = {"spec": {"securityContext": pod_context}}
    assert spec.run_as(pod, {"name": "c", "securityContext": context}) == expected


def test_run_as_non_root_refuses_uid_0() -> None:
    pod = {"spec": {"securityContext": {"runAsNonRoot": True, "runAsUser": 0}}}
    with pytest.raises(ValueError, match="runAsNonRoot and would run as root"):
        spec.run_as(pod, {"name": "c"})


def test_reachable_mounts_hide_what_a_non_root_user_cannot_traverse() -> None:
    # Not under tmp_path: pytest makes its own base directory 0700.
    WORK.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=WORK) as tmp:
        _check_reachable_mounts(Path(tmp))


def _check_reachable_mounts(tmp_path: Path) -> None:
    tmp_path.chmod(0o755)
    private = tmp_path / "home"
    (private / "py" / "bin").mkdir(parents=True)
    private.chmod(0o700)
    open_dir = tmp_path / "open" / "venv"
    open_dir.mkdir(parents=True)
    paths = [private / "py" / "bin", open_dir]
    assert mounts.reachable_mounts(paths, 0) == []
    assert mounts.reachable_mounts(paths, 1000) == [
        {"tmpfs": True, "target": str(private), "mode": 0o755},
        {"source": str(private / "py"), "target": str(private / "py"), "readOnly": True},
    ]


def test_exit_codes_and_log_tail() -> None:
    assert spec.exit_code_of(-9) == 137
    assert spec.exit_code_of(3) == 3
    log = b"".join(f"line {i}\n".encode() for i in range(200))
    tail = spec.log_tail(log)
    assert tail.endswith("line 199\n")
    assert tail.startswith("line 120\n")


def test_agent_without_privileges_stops_at_start_with_cause_and_fix(tmp_path: Path) -> None:
    """No CAP_SYS_ADMIN/CAP_NET_ADMIN (setpriv drops them): a clear error, nothing left."""
    if shutil.which("setpriv") is None:
        skip_unless_ci("setpriv (util-linux) is not installed")
    proc = subprocess.run(
        [
            "setpriv",
            "--bounding-set",
            "-sys_admin,-net_admin",
            str(AGENT),
            "--state-dir",
            str(tmp_path / "state"),
            "run",
            "--kubeconfig",
            str(tmp_path / "unused"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    assert "CAP_SYS_ADMIN" in proc.stderr and "Fix:" in proc.stderr, proc.stderr
    assert not list_netns(netns_prefix(tmp_path / "state"))


def test_log_lines_get_the_time_their_end_was_first_seen(tmp_path: Path) -> None:
    """`timestamps=true` as a kubelet answers it (the operator's time to first step
    reads it): each line led by the time the clock first saw the file reach its end."""
    log = tmp_path / "ns_pod_uid" / "main.log"
    log.parent.mkdir()
    clock = LogClock(tmp_path)
    log.write_bytes(b"starting\n")
    clock.note(1_000.0)
    log.write_bytes(b"starting\nHVJOB_RANK rank=0 size=2\n")
    clock.note(1_002.5)
    clock.note(1_003.0)  # no growth: nothing new
    stamped = clock.stamped(log, log.read_bytes()).decode().splitlines()
    assert stamped == [
        f"{format_stamp(1_000.0)} starting",
        f"{format_stamp(1_002.5)} HVJOB_RANK rank=0 size=2",
    ]
    assert format_stamp(1_002.5) == "1970-01-01T00:16:42.500000000Z"
    reading = read("\n".join(stamped))
    assert reading.rank0_seen and reading.rank0_stamp == format_stamp(1_002.5)
    # sinceTime, as the kubelet: only the lines from that second on.
    since = clock.stamped(log, log.read_bytes(), since=1_001.0).decode().splitlines()
    assert since == [f"{format_stamp(1_002.5)} HVJOB_RANK rank=0 size=2"]
    plain = clock.stamped(log, log.read_bytes(), since=1_001.0, stamps=False).decode()
    assert plain == "HVJOB_RANK rank=0 size=2\n"


def test_startup_and_liveness_probes_run_on_their_ticks_readiness_at_once() -> None:
    """As the kubelet: a startup or liveness probe's worker ticks every period from
    when the pod was taken on, so its first run is the first tick after the container
    started (and initialDelaySeconds); readiness runs as soon as the container runs."""
    startup = probes.Probe({"periodSeconds": 1}, ticks_from=100.0)
    startup.restart(now=100.3)  # the container runs 0.3 s after the pod was taken on
    assert startup.next_at == 101.0 and not startup.due(100.9) and startup.due(101.0)
    startup.ran(101.02)
    assert startup.next_at == 102.0  # on the grid, not a period after the run
    delayed = probes.Probe({"periodSeconds": 2, "initialDelaySeconds": 3}, ticks_from=100.0)
    delayed.restart(now=100.5)
    assert delayed.next_at == 104.0
    readiness = probes.Probe({"periodSeconds": 30})
    readiness.restart(now=100.3)
    assert readiness.due(100.3)
    readiness.ran(100.3)
    assert readiness.next_at == 130.3
