"""tests/support/elf.py, which the GPU image tests use to read CUDA kernels out of
Horovod's library (no cuobjdump there): checked on a real ELF and a fat binary
laid out byte by byte."""

from __future__ import annotations

import os
import struct
import sys
from pathlib import Path

import pytest

from tests.support.elf import FATBIN_MAGIC, fatbin_entries, section


def entry(kind: int, arch: int, payload: bytes) -> bytes:
    header = struct.pack("<HHII", kind, 0x0101, 64, len(payload))
    header += b"\0" * 16 + struct.pack("<I", arch)
    return header + b"\0" * (64 - len(header)) + payload


def fatbin(*entries: bytes) -> bytes:
    body = b"".join(entries)
    return struct.pack("<IHHQ", FATBIN_MAGIC, 1, 16, len(body)) + body


def test_entries_of_every_fat_binary_in_a_section() -> None:
    first = fatbin(entry(2, 80, b"\x7fELF" + b"\0" * 12), entry(2, 90, b"\0" * 24))
    second = fatbin(entry(1, 90, b".target sm_90\0\0\0"))
    data = first + b"\0" * 8 + second  # fat binaries are 8-byte aligned, padding between
    assert fatbin_entries(data) == [("elf", 80), ("elf", 90), ("ptx", 90)]
    assert fatbin_entries(b"\0" * 64) == []


def test_sections_of_a_real_elf_file() -> None:
    executable = Path(os.path.realpath(sys.executable))
    text = section(executable, ".text")
    assert text is not None and len(text) > 0
    assert section(executable, ".nv_fatbin") is None


def test_not_an_elf_file(tmp_path: Path) -> None:
    path = tmp_path / "x"
    path.write_bytes(b"#!/bin/sh\n")
    with pytest.raises(ValueError, match="not an ELF64"):
        section(path, ".text")
