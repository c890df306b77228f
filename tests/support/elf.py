"""What a CUDA shared library carries, read without CUDA's tools (no cuobjdump here).

`section` reads one section of an ELF64 little-endian file; `fatbin_entries`
lists what the CUDA fat binaries in a `.nv_fatbin` section hold: one entry per
compiled architecture, an SASS cubin (kind "elf") or PTX (kind "ptx"), with its
compute capability as nvcc's -gencode names it (sm_90 -> 90).

The fat binary layout (fatbinary_section.h and NVIDIA's fatbin container): a
16-byte header (magic 0xBA55ED50, version, header size, size of what follows),
then entries, each a header (kind, version, header size, padded payload size,
..., the architecture at byte 28) followed by its payload.
"""

from __future__ import annotations

import struct
from pathlib import Path

FATBIN_MAGIC = 0xBA55ED50
KINDS = {1: "ptx", 2: "elf"}


def section(path: Path, name: str) -> bytes | None:
    """The bytes of section `name` of an ELF64 little-endian file, None when absent."""
    data = path.read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError(f"{path} is not an ELF64 little-endian file")
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)

    def header(index: int) -> tuple[int, int, int]:
        base = shoff + index * shentsize
        (name_offset,) = struct.unpack_from("<I", data, base)
        offset, size = struct.unpack_from("<QQ", data, base + 0x18)
        return name_offset, offset, size

    _, names_offset, _ = header(shstrndx)
    for index in range(shnum):
        name_offset, offset, size = header(index)
        start = names_offset + name_offset
        if data[start : data.index(b"\0", start)].decode() == name:
            return data[offset : offset + size]
    return None


def fatbin_entries(data: bytes) -> list[tuple[str, int]]:
    """(kind, compute capability) of every entry of every fat binary in `data`."""
    entries: list[tuple[str, int]] = []
    position = 0
    while position + 16 <= len(data):
        magic, _, header_size, size = struct.unpack_from("<IHHQ", data, position)
        if magic != FATBIN_MAGIC:
            position += 8  # fat binaries are 8-byte aligned in the section
            continue
        offset, end = position + header_size, position + header_size + size
        while offset < end:
            kind, _, entry_header, padded = struct.unpack_from("<HHII", data, offset)
            (arch,) = struct.unpack_from("<I", data, offset + 28)
            entries.append((KINDS.get(kind, f"kind{kind}"), arch))
            if entry_header == 0:
                raise ValueError(f"malformed fat binary entry at {offset}")
            offset += entry_header + padded
        position = end
    return entries
