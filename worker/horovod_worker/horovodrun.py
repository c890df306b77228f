"""horovodrun, less its seconds-long probe of how Horovod was built.

``python -m horovod_worker.horovodrun ARGS`` is ``horovodrun ARGS`` (the same
options, the same checks, the same mpirun line) with one change. Before it
picks MPI or Gloo, horovodrun asks whether Horovod was built with MPI by
forking a process that imports each framework's Horovod extension in turn,
tensorflow first: a framework import, 2 to 5 s on a busy launcher, spent before
mpirun starts (docs/benchmarks, "Real pods"). The answer is in the extension
files themselves: an extension built with MPI links libmpi. This reads their
ELF dynamic sections instead, and falls back to horovodrun's own probe when
it finds no extension to read.

Horovod 0.28.1 is the last release, so the name replaced here
(``horovod.runner.launch.mpi_built``) is fixed; tests/worker/training checks
that the answer read here is the one horovodrun's own probe gives.
"""

from __future__ import annotations

import importlib.util
import struct
import sys
from pathlib import Path
from types import ModuleType
from typing import BinaryIO

# The order horovod.common.util.EXTENSIONS probes them in.
FRAMEWORKS = ("tensorflow", "torch", "mxnet")
SHT_DYNAMIC = 6
DT_NEEDED = 1


def _read(f: BinaryIO, offset: int, size: int) -> bytes:
    f.seek(offset)
    data = f.read(size)
    if len(data) != size:
        raise ValueError("truncated ELF file")
    return data


def needed_libraries(path: Path) -> list[str]:
    """The DT_NEEDED entries of an ELF64 little-endian shared object (``readelf -d``)."""
    with path.open("rb") as f:
        header = _read(f, 0, 64)
        if header[:4] != b"\x7fELF" or header[4] != 2 or header[5] != 1:
            raise ValueError(f"{path} is not an ELF64 little-endian file")
        (shoff,) = struct.unpack_from("<Q", header, 0x28)
        shentsize, shnum = struct.unpack_from("<HH", header, 0x3A)
        sections = [
            struct.unpack("<IIQQQQIIQQ", _read(f, shoff + i * shentsize, 64)) for i in range(shnum)
        ]
        needed: list[str] = []
        for _, kind, _, _, offset, size, link, _, _, _ in sections:
            if kind != SHT_DYNAMIC:
                continue
            strtab_offset, strtab_size = sections[link][4], sections[link][5]
            strings = _read(f, strtab_offset, strtab_size)
            dynamic = _read(f, offset, size)
            for tag, value in struct.iter_unpack("<qQ", dynamic):
                if tag == DT_NEEDED:
                    needed.append(strings[value : strings.index(b"\0", value)].decode())
        return needed


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


def answer_mpi_probe(launch: ModuleType, package: Path | None) -> bool:
    """Replace horovodrun's MPI probe by the extensions' answer; False when there is none."""
    built = mpi_linked(package)
    if built is None:
        return False
    if not callable(getattr(launch, "mpi_built", None)):
        raise RuntimeError("horovod.runner.launch has no mpi_built to replace (not Horovod 0.28?)")

    def mpi_built(verbose: bool = False) -> bool:
        return built

    launch.mpi_built = mpi_built  # type: ignore[attr-defined]
    return True


def main(argv: list[str] | None = None) -> None:
    from horovod.runner import launch

    answer_mpi_probe(launch, horovod_dir())
    sys.argv = ["horovodrun", *(sys.argv[1:] if argv is None else argv)]
    launch.run_commandline()


if __name__ == "__main__":
    main()
