"""horovod_worker.horovodrun reads Horovod's MPI build from its extensions' ELF files."""

from __future__ import annotations

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


def _fake_extension(package: Path, framework: str, needed: list[str]) -> None:
    """A minimal ELF64 shared object with one .dynamic section (and its .dynstr)."""
    strings = b"\0" + b"".join(n.encode() + b"\0" for n in needed)
    offsets, at = [], 1
    for n in needed:
        offsets.append(at)
        at += len(n) + 1
    dynamic = b"".join(struct.pack("<qQ", horovodrun.DT_NEEDED, o) for o in offsets)
    dynamic += struct.pack("<qQ", 0, 0)  # DT_NULL
    strtab_at, dynamic_at = 64, 64 + len(strings)
    shoff = dynamic_at + len(dynamic)
    null = b"\0" * 64
    strtab = struct.pack("<IIQQQQIIQQ", 0, 3, 0, 0, strtab_at, len(strings), 0, 0, 1, 0)
    dyn = struct.pack("<IIQQQQIIQQ", 0, 6, 0, 0, dynamic_at, len(dynamic), 1, 0, 8, 16)
    header = bytearray(64)
    header[:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<Q", header, 0x28, shoff)
    struct.pack_into("<HH", header, 0x3A, 64, 3)
    (package / framework).mkdir(parents=True, exist_ok=True)
    path = package / framework / "mpi_lib.cpython-311-x86_64-linux-gnu.so"
    path.write_bytes(bytes(header) + strings + dynamic + null + strtab + dyn)


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


def test_the_probe_is_replaced_only_with_an_answer(tmp_path: Path) -> None:
    def probe(verbose: bool = False) -> bool:
        raise AssertionError("horovodrun's own probe must not run")

    launch = types.SimpleNamespace(mpi_built=probe)
    module = cast(types.ModuleType, launch)
    assert not horovodrun.answer_mpi_probe(module, tmp_path)  # nothing to read: theirs stays
    assert launch.mpi_built is probe
    _fake_extension(tmp_path, "torch", ["libmpi.so.40"])
    assert horovodrun.answer_mpi_probe(module, tmp_path)
    assert launch.mpi_built() is True
    with pytest.raises(RuntimeError, match="no mpi_built"):
        horovodrun.answer_mpi_probe(cast(types.ModuleType, types.SimpleNamespace()), tmp_path)
