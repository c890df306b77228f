"""horovod_worker.preload with real processes: a preloader, its clients, their ranks.

No framework is needed: the preloaded module here is a marker that records the pid
that imported it, so a rank can tell whether it runs in a fork of the preloader.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from horovod_worker import preload
from localcluster.poll import wait_for
from localcluster.processes import free_port

REPO = Path(__file__).resolve().parents[2]

MARKER = """\
import os
IMPORTED_BY = os.getpid()
"""

# Prints what a rank sees, then does what its first argument says.
RANK = """\
import os, signal, sys, time
import marker
print(f"preloaded={marker.IMPORTED_BY != os.getpid()} pid={os.getpid()}", flush=True)
print(f"argv={sys.argv[1:]} cwd={os.getcwd()} asked={os.environ.get('ASKED')}", flush=True)
what = sys.argv[1]
if what == "exit":
    sys.exit(int(sys.argv[2]))
if what == "stdin":
    print("read=" + sys.stdin.readline().strip(), flush=True)
if what == "raise":
    raise RuntimeError("the rank's own error")
if what == "term-self":
    os.kill(os.getpid(), signal.SIGTERM)
if what == "trap":
    def stop(signum, frame):
        os.write(1, b"got SIGTERM\\n")  # not print: it may interrupt one
        os._exit(143)
    signal.signal(signal.SIGTERM, stop)
    print("ready", flush=True)
    time.sleep(60)
if what == "sleep":
    print("ready", flush=True)
    time.sleep(60)
"""


@pytest.fixture
def place(tmp_path: Path) -> Path:
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "marker.py").write_text(MARKER)
    (tmp_path / "rank.py").write_text(RANK)
    (tmp_path / "work").mkdir()
    return tmp_path


def env_for(place: Path, **extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(preload.STARTUP_PREFIXES) or k == "LD_LIBRARY_PATH"
    }
    env.update(
        PYTHONPATH=os.pathsep.join(
            str(p) for p in (REPO / "worker", REPO / "contract", place / "lib")
        ),
        HVJOB_PRELOAD="marker",
        HVJOB_PRELOAD_DIR=str(place / "socket"),
    )
    env.update(extra)
    return env


@pytest.fixture
def preloader(place: Path) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "horovod_worker.preload", "serve"],
        env=env_for(place),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert "marker imported" in line, line + proc.stdout.read()
    yield proc
    proc.kill()
    proc.wait(10)


def client(place: Path, *args: str, **extra: str) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "horovod_worker.preload", "--", sys.executable]
    return subprocess.Popen(
        [*command, str(place / "rank.py"), *args],
        env=env_for(place, ASKED="yes", **extra),
        cwd=place / "work",
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen[str], stdin: str = "") -> tuple[int, str, str]:
    out, err = proc.communicate(stdin, timeout=60)
    return proc.returncode, out, err


def test_a_rank_runs_in_a_fork_with_its_own_argv_cwd_env_streams_and_exit_code(
    place: Path, preloader: subprocess.Popen[str]
) -> None:
    code, out, err = finish(client(place, "exit", "7"))
    assert code == 7, (out, err)
    assert "preloaded=True" in out, (out, err)
    assert f"argv=['exit', '7'] cwd={place / 'work'} asked=yes" in out
    code, out, err = finish(client(place, "stdin"), "hello\n")
    assert code == 0 and "read=hello" in out, (out, err)


def test_an_uncaught_error_prints_its_traceback_and_exits_1(
    place: Path, preloader: subprocess.Popen[str]
) -> None:
    code, out, err = finish(client(place, "raise"))
    assert code == 1
    assert "preloaded=True" in out
    assert "RuntimeError: the rank's own error" in err, err


def test_a_rank_ended_by_a_signal_ends_its_client_by_the_same_signal(
    place: Path, preloader: subprocess.Popen[str]
) -> None:
    code, out, _ = finish(client(place, "term-self"))
    assert "preloaded=True" in out
    assert code == -signal.SIGTERM


def test_signals_to_the_client_reach_the_rank(
    place: Path, preloader: subprocess.Popen[str]
) -> None:
    proc = client(place, "trap")
    assert proc.stdout is not None
    lines = [proc.stdout.readline() for _ in range(3)]
    assert "preloaded=True" in lines[0] and lines[2].strip() == "ready", lines
    proc.send_signal(signal.SIGTERM)
    code, out, err = finish(proc)
    assert code == 143, (out, err)
    assert "got SIGTERM" in out


def test_a_killed_client_takes_its_rank_with_it(
    place: Path, preloader: subprocess.Popen[str]
) -> None:
    proc = client(place, "sleep")
    assert proc.stdout is not None
    first = proc.stdout.readline()
    assert "preloaded=True" in first, first
    rank_pid = int(first.split("pid=")[1])
    assert rank_pid != proc.pid
    proc.kill()
    proc.wait(10)

    def gone() -> bool:
        try:
            os.kill(rank_pid, 0)
        except ProcessLookupError:
            return True
        # A zombie until the preloader reaps it, which may happen between the two
        # looks: then /proc's file is gone (ENOENT) or dies as it is read (ESRCH).
        try:
            stat = Path(f"/proc/{rank_pid}/stat").read_text()
        except OSError:
            return True
        return stat.split(") ")[1][0] == "Z"

    wait_for(gone, 20, 0.1, "the rank to end with its client")


def test_without_a_preloader_the_client_execs_the_command(place: Path) -> None:
    proc = client(place, "exit", "3")
    code, out, err = finish(proc)
    assert code == 3, (out, err)
    # exec keeps the client's pid; the marker was imported by the rank itself.
    assert f"preloaded=False pid={proc.pid}" in out
    assert "no preloader answers at" in err, err
    # Not asked for (no HVJOB_PRELOAD where the rank starts): nothing said.
    code, out, err = finish(client(place, "exit", "0", HVJOB_PRELOAD="off"))
    assert code == 0 and "preloaded=False" in out and err == "", (out, err)


def test_a_rank_the_preloader_cannot_run_as_a_fresh_interpreter_is_execd(
    place: Path, preloader: subprocess.Popen[str]
) -> None:
    proc = client(place, "exit", "0", PYTHONDONTWRITEBYTECODE="1")
    code, out, err = finish(proc)
    assert code == 0
    assert f"preloaded=False pid={proc.pid}" in out
    assert "not preloaded: PYTHONDONTWRITEBYTECODE differ" in err, err


def _serve(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """A preloader that is expected to give up (it would serve until killed)."""
    return subprocess.run(
        [sys.executable, "-m", "horovod_worker.preload", "serve"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_failed_import_leaves_ranks_to_start_as_usual(place: Path) -> None:
    done = _serve(env_for(place, HVJOB_PRELOAD="marker,no_such_module_here"))
    assert done.returncode == 1
    assert "importing no_such_module_here failed" in done.stderr, done.stderr
    assert not (place / "socket" / preload.SOCKET_NAME).exists()
    code, out, _ = finish(client(place, "exit", "0"))
    assert code == 0 and "preloaded=False" in out


def test_imports_that_leave_a_thread_running_leave_ranks_to_start_as_usual(
    place: Path,
) -> None:
    # A fork keeps only the forking thread; NumPy's OpenBLAS pool was one (the
    # ours-preloaded shape of tests/e2e/test_realpods.py froze a rank, 2026-12-07).
    (place / "lib" / "threader.py").write_text(
        "import threading, time\n"
        "threading.Thread(target=time.sleep, args=(600,), daemon=True).start()\n"
    )
    done = _serve(env_for(place, HVJOB_PRELOAD="marker,threader"))
    assert done.returncode == 1
    assert "the imports left 2 threads running; ranks start as usual" in done.stderr, done.stderr
    assert not (place / "socket" / preload.SOCKET_NAME).exists()


def test_the_imports_see_one_blas_thread_and_the_environment_is_restored(
    place: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(preload.BLAS_THREADS, "8")
    with preload._one_blas_thread():
        assert os.environ[preload.BLAS_THREADS] == "1"
    assert os.environ[preload.BLAS_THREADS] == "8"
    monkeypatch.delenv(preload.BLAS_THREADS)
    with preload._one_blas_thread():
        assert os.environ[preload.BLAS_THREADS] == "1"
    assert preload.BLAS_THREADS not in os.environ


def test_a_socket_directory_others_can_enter_is_not_used(place: Path) -> None:
    (place / "socket").mkdir(mode=0o755)
    (place / "socket").chmod(0o755)
    done = subprocess.run(
        [sys.executable, "-m", "horovod_worker.preload", "serve"],
        env=env_for(place),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert "is not private" in done.stderr
    # A socket directory that cannot be made (a read-only /tmp): the same, said once.
    (place / "file").write_text("")
    done = subprocess.run(
        [sys.executable, "-m", "horovod_worker.preload", "serve"],
        env=env_for(place, HVJOB_PRELOAD_DIR=str(place / "file" / "socket")),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1 and "ranks start as usual" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_a_module_command_runs_as_python_m_would(
    place: Path, preloader: subprocess.Popen[str]
) -> None:
    (place / "lib" / "ranked.py").write_text(
        "import os, sys, marker\n"
        "print(__name__, os.path.basename(sys.argv[0]), sys.argv[1:], "
        "marker.IMPORTED_BY != os.getpid(), flush=True)\n"
    )
    command = [sys.executable, "-m", "horovod_worker.preload", "--", sys.executable]
    done = subprocess.run(
        [*command, "-u", "-m", "ranked", "--flag", "x"],
        env=env_for(place),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "__main__ ranked.py ['--flag', 'x'] True"


def test_the_command_line_rules() -> None:
    assert preload.wrap(["python", "-m", "m"]) == [
        "python", "-m", "horovod_worker.preload", "--", "python", "-m", "m",
    ]  # fmt: skip
    assert preload.wrap(["bash", "run.sh"]) == ["bash", "run.sh"]
    for name in ("python3", "python3.11", "/venv/bin/python3.13"):
        assert preload.wrap([name, "t.py"])[:3] == [name, "-m", "horovod_worker.preload"]
    for name in ("python2", "python3.11-config", "ipython", "python3.x"):
        assert preload.wrap([name, "t.py"]) == [name, "t.py"]
    assert preload.parse_program(["python", "-u", "-m", "m", "a"]) == preload.Program(
        "m", None, ["a"], True
    )
    assert preload.parse_program(["python", "t.py", "-x"]) == preload.Program(
        None, "t.py", ["-x"], False
    )
    assert preload.parse_program(["python", "-c", "pass"]) is None
    assert preload.parse_program(["python", "-X", "dev", "t.py"]) is None
    assert preload.preload_modules({"HVJOB_PRELOAD": "torch, horovod.torch"}) == [
        "torch",
        "horovod.torch",
    ]
    assert preload.preload_modules({"HVJOB_PRELOAD": "off"}) == []
    assert preload.preload_modules({}) == []


def test_the_client_is_quick_to_fall_back(place: Path) -> None:
    """The client imports nothing heavy: without a preloader its cost is a bare start."""
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "horovod_worker.preload", "--", "true"],
        env=env_for(place),
        timeout=60,
    )
    assert done.returncode == 0
    assert time.monotonic() - started < 30  # a hang, not a timing
    heavy = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import horovod_worker.preload"],
        env=env_for(place),
        capture_output=True,
        text=True,
        timeout=60,
    ).stderr
    assert "horovod_contract" not in heavy and "numpy" not in heavy


def test_sshd_starts_a_preloader_only_when_asked(place: Path) -> None:
    assert preload.start_beside({}) is None
    assert preload.start_beside({"HVJOB_PRELOAD": "off"}) is None
    env = env_for(place)
    pid = preload.start_beside(env)
    assert pid is not None
    try:
        wait_for(lambda: (place / "socket" / preload.SOCKET_NAME).exists(), 30, 0.1, "its socket")
        code, out, _ = finish(client(place, "exit", "0"))
        assert code == 0 and "preloaded=True" in out, out
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def test_the_preloader_imports_once_sshd_answers(place: Path) -> None:
    """So that the worker's first readiness probe is not starved by the imports."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "horovod_worker.preload", "serve", "--after-port", str(port)],
        env=env_for(place),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        time.sleep(1.0)
        assert not (place / "lib" / "__pycache__").exists()  # marker not imported yet
        with socket.socket() as listener:
            listener.bind(("127.0.0.1", port))
            listener.listen(1)
            line = proc.stdout.readline()
        assert "marker imported" in line, line
    finally:
        proc.kill()
        proc.wait(10)
