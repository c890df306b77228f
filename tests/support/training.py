"""Helpers of the training tests: run horovodrun, split its output by rank."""

import importlib.util
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from horovod_contract.rank_output import rank_lines
from horovod_worker.common import parse_result
from localcluster.paths import REPO

HERE = Path(__file__).resolve().parent
HOROVODRUN = Path(sys.executable).parent / "horovodrun"
# What the tests launch with: the launcher's own horovodrun (contract.HOROVODRUN_COMMAND),
# Horovod's with its build probes answered from the extension files. Horovod's own
# probe imports TensorFlow in a fresh process before every run (about 5 CPU-s); the
# answers are checked against it in test_horovodrun_shim_build.py, and
# test_example_script.py still runs Horovod's script as a user would.
HOROVODRUN_COMMAND = [sys.executable, "-m", "horovod_worker.horovodrun"]


def horovod_missing() -> str | None:
    if importlib.util.find_spec("horovod") is None:
        return "horovod is not installed in this venv (run hack/install-worker.sh)"
    if not HOROVODRUN.exists():
        return f"horovodrun not found at {HOROVODRUN}"
    return None


@dataclass
class Run:
    returncode: int
    output: str

    def rank_lines(self, rank: int) -> list[str]:
        return rank_lines(self.output, rank)

    def result(self) -> dict[str, Any]:
        return parse_result(self.output)


def worker_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO / "worker"), str(REPO / "contract"), env.get("PYTHONPATH", "")) if p
    )
    env.pop("HVJOB_EXPECTED_SIZE", None)
    # CPU training, explicitly: these tests compare CPU runs and must pass on a GPU host too.
    env["CUDA_VISIBLE_DEVICES"] = ""
    env.update(extra or {})
    return env


def horovodrun(
    args: list[str],
    np: int = 2,
    mode: str = "gloo",
    per_rank: bool = False,
    env: dict[str, str] | None = None,
    timeout: float = 240,
    module: str = "horovod_worker.train",
) -> Run:
    """Run ``horovodrun -np N -H localhost:N --<mode> python -m horovod_worker.train ARGS``
    (HOROVODRUN_COMMAND's horovodrun).

    ``module``: another entry point with the same contract (horovod_worker.benchmark).
    ``per_rank``: start through tests/support/per_rank.py, which replaces
    "{rank}" in ARGS with each process's rank (different seeds or directories).
    """
    trainer = (
        [sys.executable, str(HERE / "per_rank.py")] if per_rank else [sys.executable, "-m", module]
    )
    command = [
        *HOROVODRUN_COMMAND,
        "-np",
        str(np),
        "-H",
        f"localhost:{np}",
        f"--{mode}",
        *trainer,
        *args,
    ]
    extra = dict(env or {})
    if mode == "mpi" and os.getuid() == 0:
        extra.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        extra.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    if mode == "mpi":
        # Idle ranks yield the core instead of spinning (2 ranks on 2 cores).
        extra.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")
    done = subprocess.run(
        command,
        env=worker_env(extra),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )
    return Run(done.returncode, done.stdout)


def built_with(feature: str) -> bool:
    """Whether `horovodrun --check-build` ticks FEATURE (e.g. "MPI")."""
    out = subprocess.run(
        [str(HOROVODRUN), "--check-build"], capture_output=True, text=True, env=worker_env()
    ).stdout
    return any(line.strip() == f"[X] {feature}" for line in out.splitlines())
