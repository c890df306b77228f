"""A Python environment with only what the operator image installs.

The development venv also holds the SDK's `kubernetes` package, and kopf imports
that package whenever it is importable (about 10 MB of resident memory the
shipped operator does not carry). The benchmarks measure the operator as it
ships, so they run it from this environment: the `operator` extra's packages
from pyproject.toml, and this checkout's sources through a .pth file, so that an
edit needs no reinstall.

Made once per set of pins (its folder name holds their hash), under a lock,
because the two pytest streams of hack/test.sh can ask for it together.
"""

from __future__ import annotations

import fcntl
import hashlib
import subprocess
import sys
import tomllib
from pathlib import Path

from .paths import REPO, WORK

SOURCES = ("operator", "contract")


def operator_requirements(pyproject: Path = REPO / "pyproject.toml") -> list[str]:
    """The `operator` extra's requirement strings."""
    project = tomllib.loads(pyproject.read_text())["project"]
    return list(project["optional-dependencies"]["operator"])


def operator_python() -> str:
    """The interpreter of an environment with the operator extra only."""
    requirements = operator_requirements()
    key = hashlib.sha256("\n".join([sys.version, *requirements]).encode()).hexdigest()[:12]
    venv = WORK / f"venv-operator-{key}"
    python = venv / "bin" / "python"
    WORK.mkdir(parents=True, exist_ok=True)
    with open(WORK / "venv-operator.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (venv / "ready").exists():
            print(f"making {venv.name}: the operator extra only ...", file=sys.stderr)
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
            subprocess.run(
                [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                 *requirements],
                check=True,
            )  # fmt: skip
            site = subprocess.run(
                [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                capture_output=True, text=True, check=True,
            ).stdout.strip()  # fmt: skip
            paths = "".join(f"{REPO / source}\n" for source in SOURCES)
            (Path(site) / "horovod-operator-sources.pth").write_text(paths)
            (venv / "ready").write_text("\n".join(requirements) + "\n")
    return str(python)
