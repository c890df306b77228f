"""horovod_worker.horovodrun reads Horovod's MPI build from its extensions' ELF files."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import types
from pathlib import Path
from typing import cast

import pytest

from horovod_worker import horovodrun
from tests.support.prerequisites import skip_unless_ci


def _readelf_needed(path: Path) -> list[str]:
    out = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True, check=True)
    return [
        line.split("[", 1)[1].rstrip("]") for line in out.stdout.splitlines() if "(NEEDED)" in line
    ]


def test_needed_libraries_are_what_readelf_lists() -> None:
    if not shutil.which("readelf"):
        skip_unless_ci("readelf (binutils) is not installed")
    python = Path(sys.executable).resolve()  # an ELF file that links libc at least
    needed = horovodrun.needed_libraries(python)
    assert needed == _readelf_needed(python)
    assert any(lib.startswith("libc.so") for lib in needed)


def test_a_file_that_is_not_elf_is_refused(tmp_path: Path) -> None:
    bogus = tmp_path / "mpi_lib.so"
    bogus.write_bytes(b"#!/bin/sh\n" + b"\0" * 64)
    with pytest.raises(ValueError, match="not an ELF64"):
        horovodrun.needed_libraries(bogus)


def _fake_extension(
    package: Path, framework: str, needed: list[str], symbols: tuple[str, ...] = ()
) -> None:
    """A minimal ELF64 shared object: a .dynstr, a .dynamic naming `needed` and a
    .dynsym naming `symbols` (after the null symbol every table starts with)."""
    names = [*needed, *symbols]
    strings = b"\0" + b"".join(n.encode() + b"\0" for n in names)
    offsets, at = [], 1
    for n in names:
        offsets.append(at)
        at += len(n) + 1
    dynamic = b"".join(struct.pack("<qQ", horovodrun.DT_NEEDED, o) for o in offsets[: len(needed)])
    dynamic += struct.pack("<qQ", 0, 0)  # DT_NULL
    dynsym = b"\0" * 24 + b"".join(
        struct.pack("<IBBHQQ", o, 0x12, 0, 1, 0, 0) for o in offsets[len(needed) :]
    )
    strtab_at = 64
    dynamic_at = strtab_at + len(strings)
    dynsym_at = dynamic_at + len(dynamic)
    shoff = dynsym_at + len(dynsym)
    null = b"\0" * 64
    strtab = struct.pack("<IIQQQQIIQQ", 0, 3, 0, 0, strtab_at, len(strings), 0, 0, 1, 0)
    dyn = struct.pack("<IIQQQQIIQQ", 0, 6, 0, 0, dynamic_at, len(dynamic), 1, 0, 8, 16)
    sym = struct.pack("<IIQQQQIIQQ", 0, 11, 0, 0, dynsym_at, len(dynsym), 1, 1, 8, 24)
    header = bytearray(64)
    header[:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<Q", header, 0x28, shoff)
    struct.pack_into("<HH", header, 0x3A, 64, 4)
    (package / framework).mkdir(parents=True, exist_ok=True)
    path = package / framework / "mpi_lib.cpython-311-x86_64-linux-gnu.so"
    path.write_bytes(bytes(header) + strings + dynamic + dynsym + null + strtab + dyn + sym)


def _readelf_symbols(path: Path) -> list[str]:
    out = subprocess.run(["nm", "-D", str(path)], capture_output=True, text=True, check=True)
    return sorted(line.split()[-1].split("@")[0] for line in out.stdout.splitlines() if line)


def test_dynamic_symbols_are_what_nm_lists() -> None:
    if not shutil.which("nm"):
        skip_unless_ci("nm (binutils) is not installed")
    python = Path(sys.executable).resolve()
    assert sorted(horovodrun.dynamic_symbols(python)) == _readelf_symbols(python)


def test_gloo_is_built_when_an_extension_holds_gloos_symbols(tmp_path: Path) -> None:
    assert horovodrun.gloo_linked(None) is None
    assert horovodrun.gloo_linked(tmp_path) is None  # no extension: horovodrun probes
    # Without Gloo the extension still exports horovod_gloo_built (it returns false).
    _fake_extension(tmp_path, "torch", ["libc.so.6"], ("horovod_gloo_built", "horovod_mpi_built"))
    assert horovodrun.dynamic_symbols(horovodrun.extensions(tmp_path)[0]) == [
        "horovod_gloo_built",
        "horovod_mpi_built",
    ]
    assert horovodrun.gloo_linked(tmp_path) is False
    gloo_context = "_ZN4gloo9transport3tcp6DeviceD2Ev"  # gloo::transport::tcp::Device::~Device
    _fake_extension(tmp_path, "tensorflow", ["libc.so.6"], ("horovod_gloo_built", gloo_context))
    assert horovodrun.gloo_linked(tmp_path) is True


def test_mpi_is_built_when_an_extension_links_libmpi(tmp_path: Path) -> None:
    assert horovodrun.mpi_linked(None) is None
    assert horovodrun.mpi_linked(tmp_path) is None  # no extension: horovodrun probes
    _fake_extension(tmp_path, "torch", ["libc10.so", "libc.so.6"])
    assert horovodrun.needed_libraries(horovodrun.extensions(tmp_path)[0]) == [
        "libc10.so",
        "libc.so.6",
    ]
    assert horovodrun.mpi_linked(tmp_path) is False
    _fake_extension(tmp_path, "tensorflow", ["libmpi.so.40", "libtensorflow_framework.so.2"])
    assert horovodrun.mpi_linked(tmp_path) is True


@pytest.mark.parametrize(
    ("probe", "needed", "symbols"),
    [("mpi_built", ["libmpi.so.40"], ()), ("gloo_built", [], ("_ZN4gloo7ContextD1Ev",))],
)
def test_the_probe_is_replaced_only_with_an_answer(
    tmp_path: Path, probe: str, needed: list[str], symbols: tuple[str, ...]
) -> None:
    answer = {"mpi_built": horovodrun.answer_mpi_probe, "gloo_built": horovodrun.answer_gloo_probe}

    def theirs(verbose: bool = False) -> bool:
        raise AssertionError("horovodrun's own probe must not run")

    launch = types.SimpleNamespace(**{probe: theirs})
    module = cast(types.ModuleType, launch)
    assert not answer[probe](module, tmp_path)  # nothing to read: theirs stays
    assert getattr(launch, probe) is theirs
    _fake_extension(tmp_path, "torch", needed, symbols)
    assert answer[probe](module, tmp_path)
    assert getattr(launch, probe)(verbose=True) is True
    with pytest.raises(RuntimeError, match=f"no {probe}"):
        answer[probe](cast(types.ModuleType, types.SimpleNamespace()), tmp_path)


def test_ssh_options_are_read_from_the_operators_launcher_line(tmp_path: Path) -> None:
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("w-0.w.ns.svc slots=2\n\n# a comment\nw-1.w.ns.svc slots=2\n")
    line = ["-np", "4", "--hostfile", str(hostfile), "-p", "2222", "python", "train.py", "-p", "9"]
    options = horovodrun.read_ssh_options(line)
    assert options == horovodrun.SshOptions(["w-0.w.ns.svc", "w-1.w.ns.svc"], "2222", None)
    hosts = horovodrun.read_ssh_options(["-H", "a:2,b:1", "--ssh-port=22", "-i", "/k/id", "x"])
    assert hosts == horovodrun.SshOptions(["a", "b"], "22", "/k/id")
    missing = horovodrun.read_ssh_options(["--hostfile", str(tmp_path / "none"), "x"])
    assert missing.hosts == []


def _fake_ssh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An `ssh` first on PATH: reaches hosts named good*, logs every call."""
    calls = tmp_path / "calls"
    fake = tmp_path / "bin" / "ssh"
    fake.parent.mkdir()
    fake.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {calls}\n'
        'for a in "$@"; do case "$a" in good*) exit 0;; bad*) echo "no route to $a"; exit 255;; '
        "esac; done\nexit 1\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    return calls


def test_started_checks_answer_as_horovodrun_and_retry_a_failed_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls = _fake_ssh(tmp_path, monkeypatch)
    checks = horovodrun.SshChecks(horovodrun.SshOptions(["good-0", "bad-1", "local"], "2222"))
    # horovodrun asks only for its remote hosts, with the port as an int.
    assert checks.check(["good-0", "bad-1"], 2222, None) is None  # None: not cached
    out = capsys.readouterr().out
    assert "ssh not successful for host bad-1:\nno route to bad-1" in out
    assert "good-0" not in out
    lines = calls.read_text().splitlines()
    assert sum("good-0" in line for line in lines) == 1, "its started check was used"
    assert sum("bad-1" in line for line in lines) == horovodrun.SSH_ATTEMPTS
    assert all("-p 2222" in line and "ConnectTimeout=10" in line for line in lines)
    assert checks.running == {}, "the unasked check (local) was stopped"


def test_a_check_with_other_options_than_asked_is_run_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _fake_ssh(tmp_path, monkeypatch)
    checks = horovodrun.SshChecks(horovodrun.SshOptions(["good-0"], "9"))  # misread: -p 9
    assert checks.check(["good-0"], 2222, None) is True
    ran = [line for line in calls.read_text().splitlines()]
    assert any("-p 2222" in line for line in ran), ran


def test_no_checks_start_under_kubeflows_mpi_agent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMPI_MCA_plm_rsh_agent", "/etc/mpi/kubexec.sh")
    assert horovodrun.start_ssh_checks(["-H", "a:1", "x"]) is None
    monkeypatch.delenv("OMPI_MCA_plm_rsh_agent")
    assert horovodrun.start_ssh_checks(["python", "x.py"]) is None


def test_no_check_starts_for_this_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # horovodrun runs local ranks without ssh: a check of localhost would be wasted.
    calls = _fake_ssh(tmp_path, monkeypatch)
    assert horovodrun.start_ssh_checks(["-H", "localhost:2", "x"]) is None
    checks = horovodrun.start_ssh_checks(["-H", "127.0.0.1:1,good-1:1", "x"])
    assert checks is not None and list(checks.running) == ["good-1"]
    checks.close()
    assert "127.0.0.1" not in (calls.read_text() if calls.exists() else "")
