"""A real sshd of the worker's (horovod_worker.sshd) on loopback, and the job's
keys it serves with: what the worker's ssh tests start."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import horovod_contract as contract
from localcluster.poll import wait_for
from localcluster.processes import free_port
from tests.support.prerequisites import skip_unless_ci


def make_secret(directory: Path, host_key: bool = False) -> Path:
    """A directory shaped like the mounted <job>-ssh Secret (readable files); with
    `host_key`, also the job's host key and its known_hosts line."""
    if shutil.which("ssh-keygen") is None:
        skip_unless_ci("ssh-keygen not installed (apt-get install openssh-client)")
    directory.mkdir(parents=True, exist_ok=True)
    key = directory / contract.SSH_PRIVATE_KEY
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    shutil.copy(directory / contract.SSH_PUBLIC_KEY, directory / contract.SSH_AUTHORIZED_KEYS)
    if host_key:
        host = directory / contract.SSH_HOST_KEY
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host)], check=True)
        public = host.with_name(host.name + ".pub")
        (directory / contract.SSH_KNOWN_HOSTS).write_text(f"* {public.read_text()}")
        public.unlink()
    for path in directory.iterdir():
        path.chmod(0o444)
    return directory


def serve(secret: Path, private: Path, port: int, env: dict[str, str]) -> subprocess.Popen[str]:
    """The worker's sshd with the keys of `secret`, once it listens on `port`."""
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "horovod_worker.sshd",
            f"--keys-dir={secret}",
            f"--dir={private}",
            f"--port={port}",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )

    def listening() -> bool:
        assert server.poll() is None, server.communicate()[0]
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0

    wait_for(listening, 20, 0.1, f"sshd listening on {port}")
    return server


@dataclass(frozen=True)
class LoopbackSshd:
    """A running sshd: the job's keys, its port, and the user and HOME to reach it as."""

    secret: Path
    private: Path
    port: int
    home: Path
    env: dict[str, str]
    user: str


@contextmanager
def loopback_sshd(
    tmp_path: Path, host_key: bool = True, **extra_env: str
) -> Iterator[LoopbackSshd]:
    """The worker's sshd on a free loopback port for the test's life."""
    if not os.path.exists("/usr/sbin/sshd") or shutil.which("ssh") is None:
        skip_unless_ci(
            "openssh-server/openssh-client not installed (apt-get install openssh-server)"
        )
    secret = make_secret(tmp_path / "secret", host_key=host_key)
    private = tmp_path / "server"
    port = free_port()
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "HOME": str(home), **extra_env}
    server = serve(secret, private, port, env)
    user = subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
    try:
        yield LoopbackSshd(secret, private, port, home, env, user)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=10)
