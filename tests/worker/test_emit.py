"""A machine-read line leaves the process in one write (common.emit), as mpirun needs
to keep ranks' lines apart: under PYTHONUNBUFFERED, which the images set, print()
writes the newline apart."""

from __future__ import annotations

import io

import pytest

from horovod_contract.progress import ProgressReporter
from horovod_worker.common import emit, rank_line


class Writes(io.RawIOBase):
    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]
        self.writes.append(bytes(data))
        return len(data)


def unbuffered() -> tuple[Writes, io.TextIOWrapper]:
    """What sys.stdout is under PYTHONUNBUFFERED: no buffer, the text written through."""
    raw = Writes()
    return raw, io.TextIOWrapper(raw, write_through=True)  # type: ignore[arg-type]


def test_print_writes_the_newline_apart_and_emit_does_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    line = rank_line(1, 2, 0, 1, "j-worker-1", "cpu")
    raw, out = unbuffered()
    print(line, file=out, flush=True)
    assert raw.writes == [line.encode(), b"\n"]  # the gap another rank's line fell into
    raw, out = unbuffered()
    monkeypatch.setattr("sys.stdout", out)
    emit(line)
    assert raw.writes == [f"{line}\n".encode()]


def test_the_progress_record_is_one_write() -> None:
    raw, out = unbuffered()
    reporter = ProgressReporter(0, 2, out=out)
    assert reporter.step(1, epoch=0, samples=64)
    assert len(raw.writes) == 1 and raw.writes[0].endswith(b"\n"), raw.writes
