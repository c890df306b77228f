"""horovodrun, less its seconds-long probe of how Horovod was built, and with its
ssh check started before Horovod is imported.

``python -m horovod_worker.horovodrun ARGS`` is ``horovodrun ARGS`` (the same
options, the same checks, the same mpirun line) with two changes.

The first: before it
picks MPI or Gloo, horovodrun asks whether Horovod was built with MPI (or, for
--gloo and elastic runs, with Gloo) by forking a process that imports each
framework's Horovod extension in turn, tensorflow first: a framework import, 2
to 5 s on a busy launcher, spent before mpirun starts (docs/benchmarks, "Real
pods"). The answers are in the extension files themselves: an extension built
with MPI links libmpi, and one built with Gloo has Gloo's symbols compiled in.
This reads their ELF dynamic sections instead, and falls back to horovodrun's
own probe when it finds no extension to read.

The second: before mpirun, horovodrun runs ``ssh <host> true`` to every remote
host (5 tries each) through a spawned Python middleman per host, after its own
import (0.3 s). Here the same ssh commands start first, from the hosts and ssh
options read off the command line, and run while Horovod is imported; when
horovodrun checks, it takes their results (and tries again as it would when
one failed). A host or option read wrongly only means horovodrun's own check
runs for it. With real pods (docs/benchmarks, "Real pods"), the launcher's
start to mpirun's first output went from 1.05 s to 0.87 s (medians of 3).

Horovod 0.28.1 is the last release, so the names replaced here
(``horovod.runner.launch.mpi_built``, ``gloo_built`` and
``_check_all_hosts_ssh_successful``) are fixed; tests/worker/training checks
that each answer read here is the one
horovodrun's own probe gives, and that the ssh check's command is Horovod's.
"""

from __future__ import annotations

import importlib.util
import os
import struct
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, BinaryIO

from horovod_worker import preload

# The order horovod.common.util.EXTENSIONS probes them in.
FRAMEWORKS = ("tensorflow", "torch", "mxnet")
SHT_DYNAMIC = 6
SHT_DYNSYM = 11
DT_NEEDED = 1


def _read(f: BinaryIO, offset: int, size: int) -> bytes:
    f.seek(offset)
    data = f.read(size)
    if len(data) != size:
        raise ValueError("truncated ELF file")
    return data


def _sections(f: BinaryIO, path: Path) -> list[tuple[int, ...]]:
    """The section headers of an ELF64 little-endian file."""
    header = _read(f, 0, 64)
    if header[:4] != b"\x7fELF" or header[4] != 2 or header[5] != 1:
        raise ValueError(f"{path} is not an ELF64 little-endian file")
    (shoff,) = struct.unpack_from("<Q", header, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", header, 0x3A)
    return [struct.unpack("<IIQQQQIIQQ", _read(f, shoff + i * shentsize, 64)) for i in range(shnum)]


def _name(strings: bytes, at: int) -> str:
    return strings[at : strings.index(b"\0", at)].decode(errors="replace")


def _tables(path: Path, kind: int) -> list[tuple[bytes, bytes, int]]:
    """Each section of type `kind`: its linked string table, its bytes, its entry size."""
    with path.open("rb") as f:
        sections = _sections(f, path)
        return [
            (_read(f, sections[link][4], sections[link][5]), _read(f, offset, size), entsize)
            for _, kind_, _, _, offset, size, link, _, _, entsize in sections
            if kind_ == kind
        ]


def needed_libraries(path: Path) -> list[str]:
    """The DT_NEEDED entries of an ELF64 little-endian shared object (``readelf -d``)."""
    return [
        _name(strings, value)
        for strings, dynamic, _ in _tables(path, SHT_DYNAMIC)
        for tag, value in struct.iter_unpack("<qQ", dynamic)
        if tag == DT_NEEDED
    ]


def dynamic_symbols(path: Path) -> list[str]:
    """The names in an ELF64 little-endian file's dynamic symbol table (``nm -D``)."""
    names: list[str] = []
    for strings, table, entsize in _tables(path, SHT_DYNSYM):
        for at in range(0, len(table) - len(table) % entsize, entsize):
            (name,) = struct.unpack_from("<I", table, at)
            if name:
                names.append(_name(strings, name))
    return names


def horovod_dir() -> Path | None:
    """Where the horovod package is, without importing it."""
    spec = importlib.util.find_spec("horovod")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def extensions(package: Path) -> list[Path]:
    """The frameworks' compiled Horovod extensions (horovod/<framework>/mpi_lib*.so)."""
    return [so for name in FRAMEWORKS for so in sorted((package / name).glob("mpi_lib*.so"))]


def mpi_linked(package: Path | None) -> bool | None:
    """Whether a framework extension links MPI; None when there is none to read."""
    found = extensions(package) if package is not None else []
    if not found:
        return None
    return any(lib.startswith("libmpi") for so in found for lib in needed_libraries(so))


def gloo_linked(package: Path | None) -> bool | None:
    """Whether a framework extension has Gloo compiled in; None when there is none to read.

    Gloo has no shared library: Horovod compiles it into each extension, and only
    then does the extension's dynamic symbol table name anything in C++ namespace
    ``gloo`` (mangled ``N4gloo``). ``horovod_gloo_built`` is there either way."""
    found = extensions(package) if package is not None else []
    if not found:
        return None
    return any("N4gloo" in name for so in found for name in dynamic_symbols(so))


def _answer(launch: ModuleType, probe: str, built: bool | None) -> bool:
    """Replace launch.<probe> by a function that returns `built`; False when there is
    no answer (horovodrun's own probe stays)."""
    if built is None:
        return False
    if not callable(getattr(launch, probe, None)):
        raise RuntimeError(f"horovod.runner.launch has no {probe} to replace (not Horovod 0.28?)")

    def answer(verbose: bool = False) -> bool:
        return built

    setattr(launch, probe, answer)
    return True


def answer_mpi_probe(launch: ModuleType, package: Path | None) -> bool:
    """Replace horovodrun's MPI probe by the extensions' answer; False when there is none."""
    return _answer(launch, "mpi_built", mpi_linked(package))


def answer_gloo_probe(launch: ModuleType, package: Path | None) -> bool:
    """Replace horovodrun's Gloo probe (every --gloo and elastic run asks it) by the
    extensions' answer; False when there is none."""
    return _answer(launch, "gloo_built", gloo_linked(package))


# horovodrun's own: ssh's -o options, tries per host, and connect timeout
# (horovod.runner.util.remote, horovod.runner.launch).
SSH_PREFIX = "ssh -o PasswordAuthentication=no -o StrictHostKeyChecking=no"
SSH_ATTEMPTS = 5
SSH_CONNECT_TIMEOUT_S = 10
# Open MPI's remote-shell agent. horovodrun checks with kubeflow's kubexec.sh
# instead of ssh when it is set to that; any other agent gets no early checks
# either (horovodrun's own check runs, as before).
RSH_AGENT_VARIABLE = "OMPI_MCA_plm_rsh_agent"
# Names that are this host for sure (horovodrun also resolves the others).
LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1"})


def ssh_command(host: str, port: str | None, identity: str | None) -> str:
    """horovodrun's ssh check of one host (horovod.runner.util.remote.get_ssh_command)."""
    port_arg = f"-p {port}" if port is not None else ""
    identity_arg = f"-i {identity}" if identity is not None else ""
    timeout_arg = f"-o ConnectTimeout={SSH_CONNECT_TIMEOUT_S}"
    return f"{SSH_PREFIX} {host} {port_arg} {identity_arg} {timeout_arg} true"


@dataclass
class SshOptions:
    """The hosts and ssh options of a horovodrun command line, as far as they are read."""

    hosts: list[str] = field(default_factory=list)
    port: str | None = None
    identity: str | None = None


def read_ssh_options(argv: Sequence[str]) -> SshOptions:
    """-H/--hosts, --hostfile, -p/--ssh-port and -i/--ssh-identity-file, the first of each.

    Without horovodrun's parser (its import is what the checks overlap), an
    option's value cannot be told from the program's own arguments for sure; a
    wrong read costs one ssh, since only a check of exactly the host, port and
    identity horovodrun asks for is used.
    """
    values: dict[str, str] = {}
    names = {
        "-H": "hosts",
        "--hosts": "hosts",
        "-hostfile": "hostfile",
        "--hostfile": "hostfile",
        "-p": "port",
        "--ssh-port": "port",
        "-i": "identity",
        "--ssh-identity-file": "identity",
    }
    it = iter(argv)
    for token in it:
        name, eq, value = token.partition("=")
        key = names.get(name if eq else token)
        if key is None or key in values:
            continue
        given = value if eq else next(it, None)
        if given is not None:
            values[key] = given
    options = SshOptions(port=values.get("port"), identity=values.get("identity"))
    if "hosts" in values:
        options.hosts = [h.split(":")[0] for h in values["hosts"].split(",") if h.strip()]
    elif "hostfile" in values:
        try:
            lines = Path(values["hostfile"]).read_text().splitlines()
        except OSError:
            lines = []
        options.hosts = [
            line.split()[0] for line in lines if line.strip() and not line.startswith("#")
        ]
    return options


class SshChecks:
    """horovodrun's ssh check of each host, started at once in the background."""

    def __init__(self, options: SshOptions) -> None:
        self.options = options
        self.running = {host: self._start(host) for host in options.hosts}

    def _start(self, host: str) -> subprocess.Popen[bytes]:
        command = ssh_command(host, self.options.port, self.options.identity)
        return subprocess.Popen(
            command,
            shell=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )

    def _ran(self, host: str, port: object, identity: object) -> tuple[int, str] | None:
        """The started check's exit code and output, if it is the one asked for."""
        proc = self.running.pop(host, None)
        if proc is None:
            return None
        same = (port is None and self.options.port is None) or str(port) == self.options.port
        if not same or identity != self.options.identity:
            proc.kill()
            proc.wait()
            return None
        output, _ = proc.communicate()
        return proc.returncode, output.decode(errors="replace")

    def check(
        self,
        host_addresses: Sequence[str],
        ssh_port: object = None,
        ssh_identity_file: object = None,
    ) -> bool | None:
        """launch._check_all_hosts_ssh_successful: True, or None (not cached) after
        printing each host it could not reach, as horovodrun does."""
        port = None if ssh_port is None else str(ssh_port)
        identity = None if ssh_identity_file is None else str(ssh_identity_file)

        def one(host: str) -> tuple[int, str]:
            tried = self._ran(host, ssh_port, ssh_identity_file)
            attempts = 0 if tried is None else 1
            code, output = tried if tried is not None else (1, "")
            while code != 0 and attempts < SSH_ATTEMPTS:
                done = subprocess.run(
                    ssh_command(host, port, identity),
                    shell=True,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                )
                code, output = done.returncode, done.stdout.decode(errors="replace")
                attempts += 1
            return code, output

        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=max(1, len(host_addresses))) as pool:
            results = list(pool.map(one, host_addresses))
        self.close()
        reached = True
        for host, (code, output) in zip(host_addresses, results, strict=True):
            if code != 0:
                print(f"ssh not successful for host {host}:\n{output}")
                reached = False
        return True if reached else None

    def close(self) -> None:
        """Stop the checks nobody asked for (local hosts, a misread option)."""
        for proc in self.running.values():
            proc.kill()
            proc.wait()
        self.running.clear()


def start_ssh_checks(argv: Sequence[str]) -> SshChecks | None:
    """The checks of the remote hosts on this command line, started; None under
    another remote-shell agent or when no remote host is named."""
    if os.environ.get(RSH_AGENT_VARIABLE):
        return None
    options = read_ssh_options(argv)
    # horovodrun runs a local host's ranks without ssh, and checks none.
    options.hosts = [host for host in options.hosts if host not in LOCAL_HOSTS]
    return SshChecks(options) if options.hosts else None


def answer_ssh_check(
    launch: ModuleType, checks: SshChecks, use_cache: Callable[..., object]
) -> None:
    """Put the started checks in place of horovodrun's, under its own result cache."""
    if not callable(getattr(launch, "_check_all_hosts_ssh_successful", None)):
        raise RuntimeError(
            "horovod.runner.launch has no _check_all_hosts_ssh_successful (not Horovod 0.28?)"
        )
    launch._check_all_hosts_ssh_successful = use_cache()(checks.check)  # type: ignore[attr-defined,operator]


def preload_ranks(launch: ModuleType) -> bool:
    """Put horovod_worker.preload's client in front of a static run's rank command when
    HVJOB_PRELOAD is set: the workers' preloader then runs each rank from a process
    that has imported its framework already. Elastic runs are left as they are."""
    if not preload.preload_modules():
        return False
    original = getattr(launch, "_run_static", None)
    if not callable(original):
        raise RuntimeError("horovod.runner.launch has no _run_static to wrap (not Horovod 0.28?)")

    def _run_static(args: Any) -> Any:
        if args.command:
            args.command = preload.wrap(args.command)
        return original(args)

    launch._run_static = _run_static  # type: ignore[attr-defined]
    return True


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    checks = start_ssh_checks(args)
    from horovod.runner import launch
    from horovod.runner.util import cache

    package = horovod_dir()
    answer_mpi_probe(launch, package)
    answer_gloo_probe(launch, package)
    preload_ranks(launch)
    if checks is not None:
        answer_ssh_check(launch, checks, cache.use_cache)
    sys.argv = ["horovodrun", *args]
    try:
        launch.run_commandline()
    finally:
        if checks is not None:
            checks.close()


if __name__ == "__main__":
    main()
