"""The worker's sshd set-up: key modes, configs, and a real sshd on loopback."""

import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import horovod_contract as contract
from horovod_worker import horovodrun
from horovod_worker import sshd as sshd_module
from horovod_worker.sshd import (
    SetupError,
    install_keys,
    is_our_horovodrun,
    is_safe_path,
    passed_on_environment,
    private_dir,
    render_ssh_config,
    render_sshd_config,
)
from localcluster.processes import free_port
from tests.support.prerequisites import skip_unless_ci
from tests.support.ssh import loopback_sshd, make_secret


def test_sshd_config_is_key_only_on_the_contract_port(tmp_path: Path) -> None:
    text = render_sshd_config(tmp_path, contract.SSH_PORT, True, True, {"PATH": "/opt/venv/bin"})
    lines = set(text.splitlines())
    for line in (
        f"Port {contract.SSH_PORT}",
        "PasswordAuthentication no",
        "PubkeyAuthentication yes",
        "PermitRootLogin prohibit-password",
        "StrictModes yes",
        "UsePAM yes",
        "PermitUserEnvironment yes",
        f"AuthorizedKeysFile {tmp_path / contract.SSH_AUTHORIZED_KEYS}",
        'SetEnv PATH="/opt/venv/bin"',
    ):
        assert line in lines
    assert any(line.startswith("AcceptEnv ") and "HOROVOD_*" in line for line in lines)


def test_non_root_sshd_skips_pam_and_can_relax_strict_modes(tmp_path: Path) -> None:
    lines = render_sshd_config(tmp_path, 2222, False, False, {}).splitlines()
    assert "UsePAM no" in lines and "StrictModes no" in lines
    assert not any(line.startswith("SetEnv") for line in lines)


def test_client_config_verifies_the_job_host_key(tmp_path: Path) -> None:
    text = render_ssh_config(tmp_path, 2222, verify=True)
    assert "StrictHostKeyChecking yes" in text
    assert f"UserKnownHostsFile {tmp_path / contract.SSH_KNOWN_HOSTS}" in text
    assert "StrictHostKeyChecking no" not in text


def test_sshd_forwards_nothing(tmp_path: Path) -> None:
    lines = render_sshd_config(tmp_path, 2222, True, True, {}).splitlines()
    for line in ("AllowTcpForwarding no", "AllowStreamLocalForwarding no", "PermitTunnel no"):
        assert line in lines


def test_client_config_of_an_old_secret_skips_host_key_checks(tmp_path: Path) -> None:
    text = render_ssh_config(tmp_path, 2222, verify=False)
    assert "StrictHostKeyChecking no" in text
    assert "UserKnownHostsFile /dev/null" in text
    assert f"IdentityFile {tmp_path / contract.SSH_PRIVATE_KEY}" in text
    assert "Port 2222" in text


def test_pod_environment_is_passed_on_without_shell_state() -> None:
    env = passed_on_environment(
        {
            "PATH": "/opt/venv/bin:/usr/bin",
            "LD_LIBRARY_PATH": "/usr/local/cuda/lib64",
            "HVJOB_EXPECTED_SIZE": "4",
            "HOME": "/root",
            "HOSTNAME": "w-0",
            "SSH_CONNECTION": "x",
            "QUOTED": 'a"b',
            "MULTI": "a\nb",
            "BAD-NAME": "x",
        }
    )
    assert env == {
        "HVJOB_EXPECTED_SIZE": "4",
        "LD_LIBRARY_PATH": "/usr/local/cuda/lib64",
        "PATH": "/opt/venv/bin:/usr/bin",
    }


def test_keys_are_copied_with_the_modes_ssh_demands(tmp_path: Path) -> None:
    secret = make_secret(tmp_path / "secret")
    private = tmp_path / "home" / ".ssh"
    install_keys(secret, private)
    assert stat.S_IMODE(private.stat().st_mode) == 0o700
    assert stat.S_IMODE((private / contract.SSH_PRIVATE_KEY).stat().st_mode) == 0o600
    assert stat.S_IMODE((private / contract.SSH_AUTHORIZED_KEYS).stat().st_mode) == 0o600
    assert stat.S_IMODE((private / contract.SSH_PUBLIC_KEY).stat().st_mode) == 0o644
    assert (private / contract.SSH_PRIVATE_KEY).read_bytes() == (
        secret / contract.SSH_PRIVATE_KEY
    ).read_bytes()


def test_missing_secret_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(SetupError, match=contract.SSH_AUTHORIZED_KEYS):
        install_keys(tmp_path, tmp_path / "private")


def test_private_dir_is_its_own_under_home_or_falls_back_to_tmp(tmp_path: Path) -> None:
    # Never ~/.ssh itself: that would overwrite the user's own keys.
    assert private_dir(tmp_path, 1000) == tmp_path / ".ssh" / "horovod"
    assert stat.S_IMODE((tmp_path / ".ssh" / "horovod").stat().st_mode) == 0o700
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert private_dir(blocker, 1000) == Path("/tmp/horovod-ssh-1000")


def test_strict_modes_rejects_world_writable_parents(tmp_path: Path) -> None:
    safe = tmp_path / "safe"
    safe.mkdir(mode=0o700)
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    (open_dir / "inner").mkdir(mode=0o700)
    uid = os.getuid()
    assert not is_safe_path(open_dir / "inner", uid)
    assert not is_safe_path(Path("/tmp"), uid)
    if is_safe_path(tmp_path, uid):  # tmp_path itself may sit under /tmp
        assert is_safe_path(safe, uid)


def test_real_sshd_accepts_the_job_key_and_passes_the_pod_environment(tmp_path: Path) -> None:
    # An old Secret (no host key): the client config skips host-key checks.
    with loopback_sshd(tmp_path, host_key=False, HVJOB_PROBE="from-the-pod") as server:
        config = server.private / "ssh_config"
        out = subprocess.run(
            ["ssh", "-F", str(config), f"{server.user}@127.0.0.1", "echo $HVJOB_PROBE"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == "from-the-pod"
        # The client config also landed in ~/.ssh/config (the launcher's plain ssh).
        assert "StrictHostKeyChecking no" in (server.home / ".ssh" / "config").read_text()


def test_client_only_prepares_the_launcher_and_runs_its_command(tmp_path: Path) -> None:
    secret = make_secret(tmp_path / "secret")
    home = tmp_path / "home"
    home.mkdir()
    marker = tmp_path / "ran"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "horovod_worker.sshd",
            "--client-only",
            f"--keys-dir={secret}",
            f"--dir={tmp_path / 'private'}",
            "--",
            "touch",
            str(marker),
        ],
        env={**os.environ, "HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    assert marker.exists()
    config = (tmp_path / "private" / "ssh_config").read_text()
    assert f"Port {contract.SSH_PORT}" in config
    assert stat.S_IMODE((tmp_path / "private" / contract.SSH_PRIVATE_KEY).stat().st_mode) == 0o600
    assert (home / ".ssh" / "config").read_text() == config


def test_our_horovodrun_runs_in_the_client_set_up_interpreter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The launcher's `sshd --client-only -- python -m horovod_worker.horovodrun ...`
    starts one interpreter, not two: horovodrun runs in the first, ssh wrapper first
    on PATH; any other command (or another python) is exec'd as before."""
    secret = make_secret(tmp_path / "secret")
    bin_dir = tmp_path / "venv-bin"
    bin_dir.mkdir()
    (bin_dir / "python").symlink_to(sys.executable)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    (tmp_path / "home").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    here = [*contract.HOROVODRUN_COMMAND, "-np", "2", "python", "train.py"]
    # Another directory's python (another venv, the same interpreter) is not this one.
    assert not is_our_horovodrun(here)
    monkeypatch.setattr(sys, "executable", str(bin_dir / "python"))
    assert is_our_horovodrun(here)
    assert not is_our_horovodrun(["python", "-m", "other.module", "-np", "2"])
    assert not is_our_horovodrun(["horovodrun", "-np", "2"])

    ran: list[tuple[list[str], str]] = []
    monkeypatch.setattr(horovodrun, "main", lambda argv: ran.append((argv, os.environ["PATH"])))
    execs: list[list[str]] = []
    monkeypatch.setattr(os, "execvp", lambda file, args: execs.append(list(args)))
    private = tmp_path / "private"
    common = ["--client-only", f"--keys-dir={secret}", f"--dir={private}", "--"]
    assert sshd_module.main([*common, *here]) == 0
    assert execs == []
    assert [argv for argv, _ in ran] == [["-np", "2", "python", "train.py"]]
    assert ran[0][1].split(os.pathsep)[0] == str(private / "bin")  # the verifying ssh

    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    assert sshd_module.main([*common, "horovodrun", "-np", "2"]) == 0
    assert execs == [["horovodrun", "-np", "2"]] and len(ran) == 1


def test_the_launcher_accepts_only_the_job_host_key_whatever_horovodrun_asks(
    tmp_path: Path,
) -> None:
    other_job = make_secret(tmp_path / "other", host_key=True)
    with loopback_sshd(tmp_path) as server:
        # What horovodrun runs (horovod/runner/util/remote.py), through the client set-up.
        horovodrun_ssh = [
            "ssh",
            "-o",
            "PasswordAuthentication=no",
            "-o",
            "StrictHostKeyChecking=no",
            "-p",
            str(server.port),
            f"{server.user}@127.0.0.1",
            "echo reached",
        ]

        def launch(keys: Path, private: Path) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "horovod_worker.sshd",
                    "--client-only",
                    f"--keys-dir={keys}",
                    f"--dir={private}",
                    f"--port={server.port}",
                    "--",
                    *horovodrun_ssh,
                ],
                env=server.env,
                capture_output=True,
                text=True,
                timeout=30,
            )

        good = launch(server.secret, tmp_path / "client")
        assert good.returncode == 0, good.stderr
        assert good.stdout.strip().endswith("reached")
        assert "verifies the job's host key" in good.stdout
        # A client holding another job's known_hosts (but an authorized key) refuses.
        mixed = tmp_path / "mixed"
        shutil.copytree(server.secret, mixed)
        for path in mixed.iterdir():
            path.chmod(0o644)
        shutil.copy(other_job / contract.SSH_KNOWN_HOSTS, mixed / contract.SSH_KNOWN_HOSTS)
        bad = launch(mixed, tmp_path / "client-mixed")
        assert bad.returncode != 0
        assert "Host key verification failed" in bad.stderr, bad.stderr


def _wait_listening(port: int, seconds: float) -> subprocess.CompletedProcess[str]:
    """The worker's startup probe, as the kubelet runs it."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "horovod_worker.sshd",
            f"--port={port}",
            f"--wait-listening={seconds}",
        ],
        capture_output=True,
        text=True,
        timeout=seconds + 30,
    )


def test_startup_probe_returns_once_the_real_sshd_answers(tmp_path: Path) -> None:
    if not os.path.exists("/usr/sbin/sshd"):
        skip_unless_ci("openssh-server not installed (apt-get install openssh-server)")
    secret = make_secret(tmp_path / "secret")
    port = free_port()
    (tmp_path / "home").mkdir()
    env = {**os.environ, "HOME": str(tmp_path / "home")}
    # The probe starts first, as it does at the container's start: it waits.
    probe = subprocess.Popen(
        [sys.executable, "-m", "horovod_worker.sshd", f"--port={port}", "--wait-listening=30"],
        stderr=subprocess.PIPE,
        text=True,
    )
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "horovod_worker.sshd",
            f"--keys-dir={secret}",
            f"--dir={tmp_path / 'private'}",
            f"--port={port}",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert probe.wait(timeout=40) == 0, probe.communicate()[1]
        assert server.poll() is None, "sshd is serving"
    finally:
        probe.kill()
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=10)


def test_startup_probe_fails_when_nothing_or_no_sshd_answers() -> None:
    idle = _wait_listening(free_port(), 0.5)
    assert idle.returncode == 1
    assert "nothing answered as sshd on port" in idle.stderr and "within 0.5s" in idle.stderr
    # Something listens, but not sshd: it never sends an SSH banner.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        port = listener.getsockname()[1]
        assert _wait_listening(port, 0.5).returncode == 1
