"""The questions the image tests ask a worker image, answered live or from the record.

Every test that reads an image goes through an `ImageProbe`: `inspect()` (what
`docker image inspect` says), `run(...)` (a command in a fresh container) and
`readelf(...)` / `fatbin(...)` (a file copied out of the image and read here).

- `LiveProbe` asks Docker; with `recording=True` it also keeps every answer, keyed
  by the question, for localcluster/image_record.py's record of the GPU images.
- `RecordedProbe` answers from such a record, made by a live run of these same
  tests on an image built from the same inputs; a question the record does not
  hold fails the test (it cannot happen while the key matches, since the tests
  are part of the key).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from tests.support.docker import inspect_image, remove, run_in_image
from tests.support.elf import fatbin_entries, section
from tests.support.prerequisites import skip_unless_ci


@dataclass(frozen=True)
class Answer:
    """What a command in the image returned (a CompletedProcess's three fields)."""

    returncode: int
    stdout: str
    stderr: str


class ImageProbe(Protocol):
    name: str
    source: str  # "live", or where the record came from

    def inspect(self) -> dict[str, Any]: ...

    def run(self, *command: str, options: tuple[str, ...] = (), timeout: float = 300) -> Answer: ...

    def readelf(self, path: str, *flags: str) -> str: ...

    def fatbin(self, path: str) -> list[list[Any]] | None: ...


def question(kind: str, *args: Any) -> str:
    """One question as a record key: its kind and arguments, as JSON."""
    return json.dumps([kind, *args])


def readelf_path() -> str:
    readelf = shutil.which("readelf")
    if readelf is None:
        skip_unless_ci("readelf (binutils) is not installed here")
    assert readelf is not None
    return readelf


class LiveProbe:
    def __init__(self, docker: str, name: str, scratch: Path, recording: bool = False) -> None:
        self.docker = docker
        self.name = name
        self.source = "live"
        self.scratch = scratch
        self.answers: dict[str, Any] | None = {} if recording else None
        self._copies: dict[str, Path] = {}

    def _keep(self, key: str, answer: Any) -> Any:
        if self.answers is not None:
            self.answers[key] = answer
        return answer

    def inspect(self) -> dict[str, Any]:
        inspected = inspect_image(self.docker, self.name)
        kept = {"Config": inspected["Config"], "Size": inspected["Size"]}
        self._keep(question("inspect"), kept)
        return kept

    def run(self, *command: str, options: tuple[str, ...] = (), timeout: float = 300) -> Answer:
        done = run_in_image(self.docker, self.name, *command, timeout=timeout, options=options)
        answer = Answer(done.returncode, done.stdout, done.stderr)
        self._keep(question("run", list(command), list(options)), answer.__dict__)
        return answer

    def _copy(self, path: str) -> Path:
        """The file at `path` in the image, copied out once."""
        if path not in self._copies:
            container = f"hvk-inspect-{uuid.uuid4().hex[:8]}"
            subprocess.run(
                [self.docker, "create", "--name", container, self.name],
                check=True,
                capture_output=True,
                text=True,
            )
            try:
                into = self.scratch / uuid.uuid4().hex[:8]
                into.mkdir(parents=True)
                copy = into / Path(path).name
                subprocess.run([self.docker, "cp", f"{container}:{path}", str(copy)], check=True)
            finally:
                remove(self.docker, container)
            self._copies[path] = copy
        return self._copies[path]

    def readelf(self, path: str, *flags: str) -> str:
        done = subprocess.run(
            [readelf_path(), *flags, str(self._copy(path))],
            capture_output=True,
            text=True,
            check=True,
        )
        return str(self._keep(question("readelf", path, list(flags)), done.stdout))

    def fatbin(self, path: str) -> list[list[Any]] | None:
        data = section(self._copy(path), ".nv_fatbin")
        entries = None if data is None else [[kind, arch] for kind, arch in fatbin_entries(data)]
        self._keep(question("fatbin", path), entries)
        return entries


class NotRecorded(AssertionError):
    pass


class RecordedProbe:
    def __init__(self, name: str, entry: dict[str, Any]) -> None:
        self.name = name
        self.answers: dict[str, Any] = entry["answers"]
        self.source = (
            f"the record of {entry['recorded']} (commit {str(entry['commit'])[:12]}, "
            f"inputs {str(entry['key'])[:12]})"
        )

    def _answer(self, key: str) -> Any:
        if key not in self.answers:
            raise NotRecorded(
                f"{self.name}: {self.source} holds no answer to {key}; "
                "rebuild and record the GPU images (make record-gpu-images)"
            )
        return self.answers[key]

    def inspect(self) -> dict[str, Any]:
        answer: dict[str, Any] = self._answer(question("inspect"))
        return answer

    def run(self, *command: str, options: tuple[str, ...] = (), timeout: float = 300) -> Answer:
        return Answer(**self._answer(question("run", list(command), list(options))))

    def readelf(self, path: str, *flags: str) -> str:
        return str(self._answer(question("readelf", path, list(flags))))

    def fatbin(self, path: str) -> list[list[Any]] | None:
        answer: list[list[Any]] | None = self._answer(question("fatbin", path))
        return answer
