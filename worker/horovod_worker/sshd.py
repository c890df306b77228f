"""Run sshd in a worker pod, and set up the ssh client of the launcher.

``python -m horovod_worker.sshd`` is the worker pods' default command. The
per-job Secret is mounted at contract.SSH_MOUNT_PATH, but Secret volumes are
root-owned and group-readable, which sshd and ssh refuse for keys. So this:

1. copies the key pair and authorized_keys into a private directory (0700,
   files 0600) owned by the current user: ``~/.ssh/horovod`` when the home
   directory is writable, else ``/tmp/horovod-ssh-<uid>``;
2. takes the job's host key from the Secret (older Secrets without one: a
   fresh host key, and no host-key verification);
3. writes ``sshd_config`` (port contract.SSH_PORT, public-key auth only, root
   allowed by key only, no forwarding of any kind, the pod's environment passed
   on to sessions) and ``ssh_config`` for the client, which accepts only the
   job's host key (known_hosts from the Secret);
4. execs ``sshd -D -e -f <dir>/sshd_config`` in the foreground.

It works as root and as any other user: a non-root sshd can only log in its
own user, which is all a worker needs, and skips PAM and privilege separation.

``python -m horovod_worker.sshd --wait-listening SECONDS`` is the worker pods'
startup probe: it returns 0 as soon as sshd answers on the port with its SSH
banner, 1 when it has not within SECONDS. A tcpSocket probe run every second
comes once before sshd listens and then a second later; this one waits, so the
pod is Ready as soon as sshd is, and the launcher waits no longer than needed.

``python -m horovod_worker.sshd --client-only [-- COMMAND ...]`` only prepares
the client side (the launcher), then execs COMMAND when one is given, with
``<dir>/bin`` first on PATH: an ``ssh`` there that verifies the host key even
when its caller (horovodrun) passes ``-o StrictHostKeyChecking=no``, since ssh
keeps the first value it is given for an option. When COMMAND is this
package's horovodrun (``python -m horovod_worker.horovodrun``, the same
``python``), it runs in this interpreter instead of an exec'd one.
"""

import argparse
import os
import shutil
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import horovod_contract as contract
from horovod_worker import host_pins, preload

SSHD_CANDIDATES = ("/usr/sbin/sshd", "/usr/local/sbin/sshd")
HOST_KEY = contract.SSH_HOST_KEY
MARKER = "# written by horovod_worker.sshd"
# How often --wait-listening tries to connect while sshd starts.
WAIT_POLL_SECONDS = 0.02

# Variables a session must not inherit from the pod: they describe the shell
# that started sshd, not the session's.
NOT_PASSED_ON = frozenset(
    {"HOME", "HOSTNAME", "LOGNAME", "OLDPWD", "PWD", "SHELL", "SHLVL", "TERM", "USER", "_"}
)
# What a client may send (ssh -o SendEnv, mpirun, horovodrun).
ACCEPT_ENV = ("HOROVOD_*", "HVJOB_*", "NCCL_*", "OMPI_*", "PMIX_*", "CUDA_*", "LANG", "LC_*")


class SetupError(RuntimeError):
    """The pod cannot run sshd as configured; the message says why."""


def private_dir(home: Path, uid: int) -> Path:
    """``~/.ssh/horovod`` when the home directory can hold it, else /tmp/horovod-ssh-<uid>.

    A directory of its own, so that a run outside a container never overwrites
    the user's own keys in ~/.ssh.
    """
    ssh_dir = home / ".ssh" / "horovod"
    try:
        ssh_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError:
        return Path(f"/tmp/horovod-ssh-{uid}")
    if os.access(ssh_dir, os.W_OK | os.X_OK):
        return ssh_dir
    return Path(f"/tmp/horovod-ssh-{uid}")


def is_safe_path(path: Path, uid: int) -> bool:
    """Whether sshd's StrictModes accepts files in ``path``.

    sshd rejects authorized_keys when it or any directory above it is writable
    by group or others, or owned by neither root nor the user (/tmp fails).
    """
    current = path.resolve()
    while True:
        try:
            info = current.stat()
        except OSError:
            return False
        if info.st_uid not in (0, uid) or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return False
        if current.parent == current:
            return True
        current = current.parent


def passed_on_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The pod's variables that sessions get through SetEnv (PATH, CUDA, NCCL ...).

    Without them a rank started over ssh has neither the venv on PATH nor the
    CUDA libraries, and none of the operator's HVJOB_* variables. Values that
    sshd_config cannot quote (double quotes, newlines) are left out.
    """
    return {
        key: value
        for key, value in sorted(environ.items())
        if key not in NOT_PASSED_ON
        and not key.startswith("SSH_")
        and key.replace("_", "").isalnum()
        and '"' not in value
        and "\n" not in value
        and "\\" not in value
    }


def render_sshd_config(
    directory: Path, port: int, as_root: bool, strict_modes: bool, env: Mapping[str, str]
) -> str:
    lines = [
        MARKER,
        f"Port {port}",
        "ListenAddress 0.0.0.0",
        "ListenAddress ::",
        f"HostKey {directory / HOST_KEY}",
        f"PidFile {directory / 'sshd.pid'}",
        f"AuthorizedKeysFile {directory / contract.SSH_AUTHORIZED_KEYS}",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "PermitEmptyPasswords no",
        "PermitRootLogin prohibit-password",
        # A non-root sshd can neither use PAM nor switch users.
        f"UsePAM {'yes' if as_root else 'no'}",
        f"StrictModes {'yes' if strict_modes else 'no'}",
        "PermitUserEnvironment yes",
        f"AcceptEnv {' '.join(ACCEPT_ENV)}",
        # Horovod and mpirun open many sessions at once to the same worker.
        "MaxStartups 100:30:200",
        "MaxSessions 100",
        "UseDNS no",
        "PrintMotd no",
        "X11Forwarding no",
        # Nothing of Horovod or Open MPI forwards ports over ssh.
        "AllowTcpForwarding no",
        "AllowStreamLocalForwarding no",
        "AllowAgentForwarding no",
        "PermitTunnel no",
        "LogLevel INFO",
        "Subsystem sftp internal-sftp",
    ]
    if env:
        pairs = " ".join(f'{key}="{value}"' for key, value in env.items())
        lines.append(f"SetEnv {pairs}")
    return "\n".join(lines) + "\n"


def render_ssh_config(
    directory: Path, port: int, verify: bool, pins: Mapping[str, str] | None = None
) -> str:
    """The client's config. With `verify`, only the job's host key is accepted;
    `pins`: workers' addresses resolved once (horovod_worker.host_pins)."""
    if verify:
        host_keys = [
            "    StrictHostKeyChecking yes",
            f"    UserKnownHostsFile {directory / contract.SSH_KNOWN_HOSTS}",
            "    GlobalKnownHostsFile /dev/null",
        ]
    else:
        host_keys = ["    StrictHostKeyChecking no", "    UserKnownHostsFile /dev/null"]
    return "\n".join(
        [
            MARKER,
            *host_pins.render(dict(pins or {})),
            "Host *",
            f"    Port {port}",
            f"    IdentityFile {directory / contract.SSH_PRIVATE_KEY}",
            "    IdentitiesOnly yes",
            *host_keys,
            "    LogLevel ERROR",
            "    BatchMode yes",
            "    ConnectTimeout 10",
            "    ServerAliveInterval 30",
            "",
        ]
    )


def render_ssh_wrapper(ssh: str, config: Path, verify: bool) -> str:
    """An ``ssh`` for PATH whose own options come before its caller's."""
    options = f'-F "{config}"'
    if verify:
        options += " -o StrictHostKeyChecking=yes"
    return f'#!/bin/sh\n{MARKER}\nexec "{ssh}" {options} "$@"\n'


def _write(path: Path, text: str | bytes, mode: int) -> None:
    """Write with ``mode`` from the start (never briefly readable by others)."""
    data = text.encode() if isinstance(text, str) else text
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def install_keys(keys_dir: Path, directory: Path) -> bool:
    """Copy the Secret's files into ``directory`` with the modes ssh demands; True
    when the Secret holds the job's host key (and so host keys are verified)."""
    wanted = (contract.SSH_PRIVATE_KEY, contract.SSH_PUBLIC_KEY, contract.SSH_AUTHORIZED_KEYS)
    missing = [name for name in wanted if not (keys_dir / name).is_file()]
    if missing:
        raise SetupError(
            f"ssh key files missing in {keys_dir}: {', '.join(missing)} "
            f"(the job's <job>-ssh Secret is mounted at {contract.SSH_MOUNT_PATH})"
        )
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    for name in wanted:
        mode = 0o644 if name == contract.SSH_PUBLIC_KEY else 0o600
        _write(directory / name, (keys_dir / name).read_bytes(), mode)
    host_files = (contract.SSH_HOST_KEY, contract.SSH_KNOWN_HOSTS)
    if not all((keys_dir / name).is_file() for name in host_files):
        return False
    for name in host_files:
        _write(directory / name, (keys_dir / name).read_bytes(), 0o600)
    return True


def install_client_config(
    directory: Path, port: int, home: Path, verify: bool, pins: Mapping[str, str] | None = None
) -> Path:
    """Write ``<dir>/ssh_config``; also ``~/.ssh/config`` unless the user wrote one."""
    config = directory / "ssh_config"
    text = render_ssh_config(directory, port, verify, pins)
    _write(config, text, 0o600)
    user_config = home / ".ssh" / "config"
    if user_config != config and os.access(home, os.W_OK):
        try:
            if not user_config.exists() or user_config.read_text().startswith(MARKER):
                user_config.parent.mkdir(mode=0o700, exist_ok=True)
                _write(user_config, text, 0o600)
        except OSError:
            pass  # the config in `directory` still works with ssh -F
    return config


def install_ssh_wrapper(directory: Path, config: Path, verify: bool) -> Path:
    """``<dir>/bin/ssh``, to put first on PATH; returns the directory."""
    ssh = shutil.which("ssh")
    if ssh is None:
        raise SetupError("ssh not found: install openssh-client in the image")
    bin_dir = directory / "bin"
    bin_dir.mkdir(mode=0o700, exist_ok=True)
    _write(bin_dir / "ssh", render_ssh_wrapper(ssh, config, verify), 0o700)
    return bin_dir


def generate_host_key(directory: Path) -> None:
    key = directory / HOST_KEY
    for path in (key, key.with_name(f"{HOST_KEY}.pub")):
        path.unlink(missing_ok=True)
    ssh_keygen = shutil.which("ssh-keygen")
    if ssh_keygen is None:
        raise SetupError("ssh-keygen not found: install openssh-client")
    subprocess.run(
        [ssh_keygen, "-q", "-t", "ed25519", "-N", "", "-C", "horovod-worker", "-f", str(key)],
        check=True,
    )


def find_sshd() -> str:
    for candidate in (*SSHD_CANDIDATES, shutil.which("sshd")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise SetupError("sshd not found: install openssh-server in the worker image")


def prepare_server(
    keys_dir: Path, directory: Path, port: int, home: Path, environ: Mapping[str, str]
) -> list[str]:
    """Everything before exec; returns the sshd command line."""
    uid = os.getuid()
    sshd = find_sshd()
    verify = install_keys(keys_dir, directory)
    install_client_config(directory, port, home, verify)
    if not verify:
        generate_host_key(directory)
    strict = is_safe_path(directory, uid)
    if not strict:
        print(
            f"horovod_worker.sshd: {directory} is under a directory that group or others "
            "can write; StrictModes off (keys are still 0600 in a 0700 directory)",
            file=sys.stderr,
            flush=True,
        )
    as_root = uid == 0
    if as_root:
        # Privilege separation needs this empty directory; images often lack it.
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    config = directory / "sshd_config"
    env = passed_on_environment(environ)
    _write(config, render_sshd_config(directory, port, as_root, strict, env), 0o600)
    check = subprocess.run([sshd, "-t", "-f", str(config)], capture_output=True, text=True)
    if check.returncode != 0:
        raise SetupError(f"sshd rejects {config}: {check.stderr.strip()}")
    return [sshd, "-D", "-e", "-f", str(config)]


def sshd_answers(port: int, timeout: float, host: str = "127.0.0.1") -> bool:
    """Whether an ssh server on host:port sends its banner within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        try:
            with socket.create_connection((host, port), timeout=max(left, 0.05)) as sock:
                if sock.recv(256).startswith(b"SSH-"):
                    return True
        except OSError:
            pass
        if time.monotonic() + WAIT_POLL_SECONDS >= deadline:
            return False
        time.sleep(WAIT_POLL_SECONDS)


def is_our_horovodrun(command: Sequence[str]) -> bool:
    """Whether COMMAND is this package's horovodrun run by the `python` that runs
    this (the launcher's command line: contract.HOROVODRUN_COMMAND)."""
    prefix = list(contract.HOROVODRUN_COMMAND)
    if list(command[: len(prefix)]) != prefix:
        return False
    found = shutil.which(prefix[0])
    if found is None:
        return False
    # The same interpreter in the same directory: two venvs' pythons are links to
    # one interpreter, each with its own packages.
    try:
        return os.path.samefile(found, sys.executable) and os.path.samefile(
            os.path.dirname(found), os.path.dirname(sys.executable)
        )
    except OSError:
        return False


def pinned_workers(command: Sequence[str]) -> dict[str, str]:
    """The workers of a static horovodrun command, each with the address its name has
    now (horovod_worker.host_pins); none for any other command."""
    if not is_our_horovodrun(command):
        return {}
    args = command[len(contract.HOROVODRUN_COMMAND) :]
    if not host_pins.is_static_horovodrun(args):
        return {}
    from horovod_worker.horovodrun import read_ssh_options

    hosts = read_ssh_options(args).hosts
    pins = host_pins.pin(hosts)
    missing = [h for h in hosts if h not in pins and h != "localhost"]
    if missing:
        print(
            f"horovod_worker.sshd: {len(missing)} worker name(s) did not resolve within "
            f"{host_pins.WAIT_S:g}s (first: {missing[0]}); ssh will ask the DNS for them",
            file=sys.stderr,
            flush=True,
        )
    return pins


def run_horovodrun_here(args: Sequence[str]) -> int:
    """horovodrun in this interpreter instead of a fresh one: its ssh checks start
    and its import begins a Python start-up sooner (0.1 to 0.3 s of the launcher's
    path to mpirun on a busy node, docs/benchmarks "Real pods")."""
    from horovod_worker import horovodrun

    horovodrun.main(list(args))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="horovod_worker.sshd",
        description="Prepare ssh keys from the job's Secret and run sshd in the foreground "
        "(worker pods), or prepare only the ssh client (--client-only, the launcher).",
    )
    parser.add_argument(
        "--keys-dir",
        type=Path,
        default=Path(contract.SSH_MOUNT_PATH),
        help="where the job's ssh Secret is mounted",
    )
    parser.add_argument(
        "--dir",
        type=Path,
        help="private directory for keys and configs (default: ~/.ssh/horovod when "
        "writable, else /tmp/horovod-ssh-<uid>)",
    )
    parser.add_argument("--port", type=int, default=contract.SSH_PORT, help="sshd's port")
    parser.add_argument(
        "--client-only",
        action="store_true",
        help="set up the ssh client only (keys and ssh_config), then exec COMMAND if given",
    )
    parser.add_argument(
        "--wait-listening",
        type=float,
        metavar="SECONDS",
        help="only wait until sshd answers on --port (at most SECONDS): exit 0 when it "
        "does, 1 when not (the worker pods' startup probe)",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND to exec")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.wait_listening is not None:
        if sshd_answers(args.port, args.wait_listening):
            return 0
        print(
            f"horovod_worker.sshd: nothing answered as sshd on port {args.port} within "
            f"{args.wait_listening:g}s; the worker's log says why",
            file=sys.stderr,
            flush=True,
        )
        return 1
    home = Path(os.environ.get("HOME") or os.path.expanduser("~"))
    directory = args.dir or private_dir(home, os.getuid())
    command = [c for c in args.command if c != "--"] if args.command else []
    try:
        if args.client_only:
            verify = install_keys(args.keys_dir, directory)
            pins = pinned_workers(command)
            config = install_client_config(directory, args.port, home, verify, pins)
            bin_dir = install_ssh_wrapper(directory, config, verify)
            checked = "verifies the job's host key" if verify else "does NOT verify host keys"
            print(f"horovod_worker.sshd: ssh client configured ({checked}): {config}", flush=True)
            if command:
                os.environ["PATH"] = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
                if is_our_horovodrun(command):
                    return run_horovodrun_here(command[len(contract.HOROVODRUN_COMMAND) :])
                os.execvp(command[0], command)
            return 0
        argv_sshd = prepare_server(args.keys_dir, directory, args.port, home, os.environ)
    except (SetupError, OSError, subprocess.CalledProcessError) as exc:
        print(f"horovod_worker.sshd: error: {exc}", file=sys.stderr, flush=True)
        return 1
    print(
        f"horovod_worker.sshd: uid {os.getuid()} serving port {args.port} from {directory}",
        flush=True,
    )
    # HVJOB_PRELOAD: import the framework while the launcher comes (horovod_worker.preload).
    preload.start_beside(port=args.port)
    os.execv(argv_sshd[0], argv_sshd)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
