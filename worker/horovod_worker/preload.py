"""Ranks that start with their framework already imported.

Most of a job's path from apply to its first training step is each rank's own
start: the interpreter, ``import torch, horovod.torch`` and ``hvd.init()``
(docs/benchmarks, "Apply -> first step"). A worker pod waits for its launcher
anyway, so it can do the imports before any rank is asked for:

- ``python -m horovod_worker.preload serve`` (started by horovod_worker.sshd
  beside sshd when the pod's ``HVJOB_PRELOAD`` names modules, e.g.
  ``torch,horovod.torch``) binds a Unix socket, imports those modules and then
  forks one child per rank that asks. The child takes the rank's command line,
  environment, working directory and standard streams, runs the program as
  ``python`` would (``runpy``, as ``__main__``) and reports its exit status.
- ``python -m horovod_worker.preload -- python -m horovod_worker.train ...`` is
  the client, started in the rank's place (the launcher's horovodrun puts it in
  front of the command when its own ``HVJOB_PRELOAD`` is set). It hands its
  request and streams over, passes on every signal it is sent (mpirun's SIGTERM
  on a failed rank, a suspension's), and ends as the rank ended: the same exit
  code, or the same signal.

When the preloader cannot run the rank as a fresh interpreter would, the client
execs the command instead, unchanged: no preloader (a TensorFlow image, the
launcher's own host), another interpreter, interpreter options other than
``-u``, ``PYTHON*`` or ``LD_*`` variables that differ from the preloader's,
or a preloader whose imports failed. A client that dies (SIGKILL) takes its rank
with it: the preloader kills a child whose client's connection closed.

The rank differs from a fresh interpreter in what a fork keeps: modules
imported before (and their state), the hash seed (the same on every rank of the
pod), its command line in ``ps`` (the preloader's), and NumPy's BLAS, which runs
one thread. NumPy's global random state, which a fork would share among ranks, is
seeded again in each child. A fork of a threaded process is not safe (a lock
another thread held stays held in the child): the imports run with
OPENBLAS_NUM_THREADS=1, since NumPy's OpenBLAS (torch imports NumPy) otherwise
starts a thread pool as it loads, and a preloader whose imports left any other
thread running serves no rank. TensorFlow is not preloaded for that reason: it
starts threads at import.
"""

from __future__ import annotations

import array
import contextlib
import json
import os
import re
import selectors
import shutil
import signal
import socket
import struct
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, NoReturn

# Modules to import in the worker pod before any rank starts: comma-separated, or
# "off"/empty for none (the default: every rank starts its own interpreter).
PRELOAD_ENV: Final = "HVJOB_PRELOAD"
# Where the socket lives: a directory only the pod's user can enter (a socket in
# it runs code as that user for whoever can connect).
SOCKET_DIR_ENV: Final = "HVJOB_PRELOAD_DIR"
SOCKET_NAME: Final = "preload.sock"
# Variables that change what an interpreter loads at start: a request whose values
# differ from the preloader's gets an exec'd interpreter instead.
STARTUP_PREFIXES: Final = ("PYTHON", "LD_")
NOT_COMPARED: Final = frozenset({"PYTHONUNBUFFERED"})
# A request is a length (4 bytes, big-endian) and that many bytes of JSON.
HEADER: Final = struct.Struct(">I")
MAX_REQUEST: Final = 16 << 20
REQUEST_TIMEOUT_S: Final = 10.0
BLAS_THREADS: Final = "OPENBLAS_NUM_THREADS"
# Signals the client passes on to its rank (SIGKILL and SIGSTOP cannot be caught;
# a client killed closes its connection, and the preloader kills the rank).
FORWARDED: Final = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGCONT,
)


def preload_modules(environ: Mapping[str, str] = os.environ) -> list[str]:
    """The modules HVJOB_PRELOAD names; none when it is unset, empty or "off"."""
    value = environ.get(PRELOAD_ENV, "").strip()
    if value.lower() in ("", "off", "false", "0", "no"):
        return []
    return [name.strip() for name in value.split(",") if name.strip()]


def socket_path(environ: Mapping[str, str] = os.environ) -> Path:
    """The preloader's socket: per user and per network namespace, which is per pod.
    /tmp is the container's own in a pod, but not where pods are processes of one host
    (the node agent of the tests), and a rank must never start in another pod."""
    base = environ.get(SOCKET_DIR_ENV)
    if not base:
        try:
            netns = os.stat("/proc/self/ns/net").st_ino
        except OSError:
            netns = 0
        base = f"/tmp/horovod-preload-{os.getuid()}-{netns}"
    return Path(base) / SOCKET_NAME


def private_enough(directory: Path) -> bool:
    """Whether ``directory`` is this user's and nobody else's (mode 0700 or less)."""
    try:
        info = directory.stat()
    except OSError:
        return False
    return info.st_uid == os.getuid() and not info.st_mode & 0o077


# python, python3 or python3.N: a venv made from another venv's interpreter writes
# python3.11 into its scripts' first line, and pytest then runs as python3.11 (a
# warm CI clone of 4b820bc: its ranks were not preloaded).
PYTHON_NAME: Final = re.compile(r"python(3(\.\d+)?)?")


def wrap(command: Sequence[str]) -> list[str]:
    """The launcher's rank command with the client in front, when it runs Python."""
    if not command or not PYTHON_NAME.fullmatch(os.path.basename(command[0])):
        return list(command)
    return [command[0], "-m", "horovod_worker.preload", "--", *command]


@dataclass(frozen=True)
class Program:
    """What ``python [-u] (-m MODULE | SCRIPT) ARGS...`` runs."""

    module: str | None
    script: str | None
    args: list[str]
    unbuffered: bool


def parse_program(argv: Sequence[str]) -> Program | None:
    """The program of a Python command line; None for any option but -u and -m."""
    rest = list(argv[1:])
    unbuffered = False
    while rest and rest[0] == "-u":
        unbuffered = True
        rest.pop(0)
    if not rest:
        return None
    if rest[0] == "-m" and len(rest) >= 2:
        return Program(rest[1], None, rest[2:], unbuffered)
    if rest[0].startswith("-"):
        return None
    return Program(None, rest[0], rest[1:], unbuffered)


def startup_variables(environ: Mapping[str, str]) -> dict[str, str]:
    return {
        key: value
        for key, value in environ.items()
        if key.startswith(STARTUP_PREFIXES) and key not in NOT_COMPARED
    }


def refusal(argv: Sequence[str], env: Mapping[str, str], cwd: str) -> str | None:
    """Why this interpreter cannot run the command as a fresh one would; None if it can."""
    if not argv:
        return "no command"
    found = shutil.which(argv[0], path=env.get("PATH")) if "/" not in argv[0] else argv[0]
    if found is None:
        return f"{argv[0]} is not on the rank's PATH"
    # The same file and the same directory: a venv's python is a link to the system's,
    # and only the venv's sees the venv's packages.
    asked, here = os.path.abspath(os.path.join(cwd, found)), os.path.abspath(sys.executable)
    same_file = os.path.realpath(asked) == os.path.realpath(here)
    if not same_file or os.path.dirname(asked) != os.path.dirname(here):
        return f"{argv[0]} ({asked}) is not this preloader's interpreter ({here})"
    if parse_program(argv) is None:
        return "interpreter options other than -u"
    differ = sorted(
        key
        for key in set(startup_variables(env)) | set(startup_variables(os.environ))
        if env.get(key) != os.environ.get(key)
    )
    if differ:
        return f"{', '.join(differ)} differ from the preloader's"
    return None


# The client: what mpirun starts in the rank's place.


def _send_request(conn: socket.socket, argv: Sequence[str]) -> None:
    body = json.dumps({"argv": list(argv), "env": dict(os.environ), "cwd": os.getcwd()})
    data = body.encode()
    streams = array.array("i", [0, 1, 2])
    conn.sendmsg([HEADER.pack(len(data)) + data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, streams)])


def _read_line(conn: socket.socket, pending: bytearray) -> str | None:
    while b"\n" not in pending:
        chunk = conn.recv(4096)
        if not chunk:
            return None
        pending.extend(chunk)
    line, _, rest = bytes(pending).partition(b"\n")
    pending[:] = rest
    return line.decode()


def _exec(command: Sequence[str]) -> NoReturn:
    os.execvp(command[0], list(command))


def _say_fresh(why: str) -> None:
    print(
        f"horovod_worker.preload: {why}; this rank starts its own interpreter",
        file=sys.stderr,
        flush=True,
    )


def client(command: Sequence[str]) -> int:
    """Run ``command`` in a child of the preloader, or exec it when none can."""
    if not command:
        print("horovod_worker.preload: no command to run", file=sys.stderr)
        return 2
    path = socket_path()
    answer: str | None = None
    pending = bytearray()
    if private_enough(path.parent):
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(str(path))
            _send_request(conn, command)
            answer = _read_line(conn, pending)
        except OSError:
            answer = None
    if answer is None or not answer.startswith("pid "):
        if answer is not None:
            conn.close()
        if answer is not None and answer.startswith("no "):
            _say_fresh(f"not preloaded: {answer[3:]}")
        elif preload_modules():  # asked for (the launcher's variables reach the ranks)
            _say_fresh(f"no preloader answers at {path}")
        _exec(command)
    pid = int(answer.split()[1])

    def forward(signum: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)

    for signum in FORWARDED:
        signal.signal(signum, forward)
    ended = _read_line(conn, pending)
    conn.close()
    if ended is None or not ended.startswith("exit "):
        print(
            f"horovod_worker.preload: the preloader ended before rank process {pid}; "
            "its exit status is unknown",
            file=sys.stderr,
        )
        return 1
    code = int(ended.split()[1])
    if code < 0:  # ended by a signal: end the same way, as orted would have seen it
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        return 128 - code
    return code


# The preloader.


@dataclass(frozen=True)
class Request:
    """A rank's command line, environment and working directory."""

    argv: list[str]
    env: dict[str, str]
    cwd: str


def _parse_request(raw: object) -> Request:
    if not isinstance(raw, dict):
        raise ValueError("not an object")
    argv, env, cwd = raw.get("argv"), raw.get("env"), raw.get("cwd")
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        raise ValueError("argv is not a list of strings")
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise ValueError("env is not a map of strings")
    if not isinstance(cwd, str):
        raise ValueError("cwd is not a string")
    return Request(argv, {str(k): v for k, v in env.items()}, cwd)


def _receive(conn: socket.socket) -> tuple[Request, list[int]]:
    """A request and the file descriptors that came with it."""
    conn.settimeout(REQUEST_TIMEOUT_S)
    fds = array.array("i")
    data, ancillary, _, _ = conn.recvmsg(1 << 16, socket.CMSG_SPACE(3 * fds.itemsize))
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    buffer = bytearray(data)
    try:
        if len(buffer) < HEADER.size:
            raise ValueError("short request")
        (size,) = HEADER.unpack_from(buffer)
        if size > MAX_REQUEST:
            raise ValueError(f"request of {size} bytes")
        while len(buffer) < HEADER.size + size:
            chunk = conn.recv(1 << 16)
            if not chunk:
                raise ValueError("request cut short")
            buffer.extend(chunk)
        request = _parse_request(json.loads(buffer[HEADER.size : HEADER.size + size]))
        if len(fds) != 3:
            raise ValueError(f"{len(fds)} streams, not 3")
    except (ValueError, OSError):
        for fd in fds:
            os.close(fd)
        raise
    conn.settimeout(None)
    return request, list(fds)


def _reopen_streams(unbuffered: bool) -> None:
    """sys.stdin/stdout/stderr on the rank's descriptors, buffered as a new interpreter's."""
    import io

    encoding = sys.stdout.encoding if sys.stdout is not None else "utf-8"
    # The rank's streams for the rest of its life: no context manager.
    stdin = io.TextIOWrapper(open(0, "rb", closefd=False), encoding=encoding)  # noqa: SIM115
    out = open(1, "wb", buffering=0 if unbuffered else -1, closefd=False)  # noqa: SIM115
    err = open(2, "wb", buffering=0 if unbuffered else -1, closefd=False)  # noqa: SIM115
    stdout = io.TextIOWrapper(out, encoding=encoding, write_through=unbuffered)
    stderr = io.TextIOWrapper(
        err,
        encoding=encoding,
        errors="backslashreplace",
        line_buffering=True,
        write_through=unbuffered,
    )
    sys.stdin, sys.stdout, sys.stderr = stdin, stdout, stderr
    for name, stream in (("__stdin__", stdin), ("__stdout__", stdout), ("__stderr__", stderr)):
        setattr(sys, name, stream)  # what a new interpreter's would be


def _run_as_main(program: Program, argv0: str, cwd: str) -> int:
    """Run the program as ``python`` runs it; its exit code."""
    import runpy
    import traceback

    code = 0
    try:
        if program.module is not None:
            sys.argv = [argv0, *program.args]  # runpy puts the module's path in argv[0]
            sys.path[0] = cwd
            runpy.run_module(program.module, run_name="__main__", alter_sys=True)
        else:
            assert program.script is not None
            sys.argv = [program.script, *program.args]
            sys.path[0] = os.path.dirname(os.path.abspath(program.script))
            runpy.run_path(program.script, run_name="__main__")
    except SystemExit as done:
        if done.code is None:
            code = 0
        elif isinstance(done.code, int):
            code = done.code
        else:
            print(done.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:
        traceback.print_exc()
        code = 128 + signal.SIGINT
    except BaseException:  # what the interpreter prints for an uncaught one
        exc_type, value, tb = sys.exc_info()
        assert exc_type is not None and value is not None
        sys.excepthook(exc_type, value, tb)
        code = 1
    return code


def _become_rank(request: Request, fds: Sequence[int]) -> NoReturn:
    """In the forked child: take over the rank's streams and environment, run it, exit."""
    code = 1
    try:
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        program = parse_program(request.argv)
        assert program is not None  # refusal() checked it
        os.chdir(request.cwd)
        os.environ.clear()
        os.environ.update(request.env)
        _reopen_streams(program.unbuffered or bool(request.env.get("PYTHONUNBUFFERED")))
        numpy = sys.modules.get("numpy")
        if numpy is not None:  # a fresh interpreter seeds its own
            numpy.random.seed()
        code = _run_as_main(program, request.argv[0], request.cwd)
        import threading

        # What the interpreter does at exit: wait for the program's threads, then
        # run its exit hooks (Horovod's calls MPI_Finalize; without it mpirun calls
        # the rank's end improper).
        threading._shutdown()  # type: ignore[attr-defined]
        import atexit

        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
    finally:
        os._exit(code)


class Preloader:
    """The socket, the children and the connections of their clients."""

    def __init__(self, listener: socket.socket) -> None:
        self.listener = listener
        self.selector = selectors.DefaultSelector()
        self.children: dict[int, socket.socket] = {}
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)

    def run(self) -> None:
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        self.selector.register(self.listener, selectors.EVENT_READ, "listener")
        self.selector.register(self.wake_r, selectors.EVENT_READ, "wake")
        while True:
            for key, _ in self.selector.select():
                if key.data == "listener":
                    self._accept()
                elif key.data == "wake":
                    while True:
                        try:
                            if not os.read(self.wake_r, 512):
                                break
                        except BlockingIOError:
                            break
                else:
                    self._client_spoke(key.fileobj, key.data)  # type: ignore[arg-type]
            self._reap()

    def _accept(self) -> None:
        conn, _ = self.listener.accept()
        try:
            request, fds = _receive(conn)
        except (OSError, ValueError) as exc:
            print(f"horovod_worker.preload: a bad request: {exc}", file=sys.stderr, flush=True)
            conn.close()
            return
        why = refusal(request.argv, request.env, request.cwd)
        if why is not None:
            for fd in fds:
                os.close(fd)
            self._say(conn, f"no {why}")
            conn.close()
            return
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            # The child first: no wakeups to the preloader's pipe, no preloader's handlers.
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            self.selector.close()
            self.listener.close()
            for other in self.children.values():
                other.close()
            os.close(self.wake_r)
            os.close(self.wake_w)
            conn.close()
            _become_rank(request, fds)
        for fd in fds:
            os.close(fd)
        self.children[pid] = conn
        self.selector.register(conn, selectors.EVENT_READ, pid)
        self._say(conn, f"pid {pid}")
        print(f"horovod_worker.preload: process {pid} runs {' '.join(request.argv)}", flush=True)

    def _client_spoke(self, conn: socket.socket, pid: int) -> None:
        """A client says nothing after its request: readable means it is gone."""
        try:
            data = conn.recv(64)
        except OSError:
            data = b""
        if data:
            return
        self.selector.unregister(conn)
        conn.close()
        if self.children.get(pid) is conn:
            del self.children[pid]
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.children.pop(pid, None)
            if conn is None:
                continue
            self.selector.unregister(conn)
            code = os.waitstatus_to_exitcode(status)
            self._say(conn, f"exit {code}")
            conn.close()
            print(f"horovod_worker.preload: process {pid} exited with {code}", flush=True)

    @staticmethod
    def _say(conn: socket.socket, line: str) -> None:
        with contextlib.suppress(OSError):
            conn.sendall(f"{line}\n".encode())


# How long the preloader waits for sshd to answer before it imports anyway.
SSHD_WAIT_S: Final = 30.0


def wait_for_port(port: int, limit: float = SSHD_WAIT_S) -> bool:
    """Whether something answers on 127.0.0.1:`port` within `limit` seconds."""
    import time

    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.05)
    return False


def serve(modules: Sequence[str], path: Path, after_port: int | None = None) -> int:
    """Bind, import, then fork ranks until killed. Ranks that ask while the imports
    run wait in the socket's backlog; if an import fails they get an exec'd
    interpreter instead. `after_port`: import only once sshd answers there, so that
    the worker's first readiness probe is not starved by the imports (on kind's
    kubelet it failed, and the next came a probe period, 30 s, later)."""
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not private_enough(path.parent):
            raise OSError(f"{path.parent} is not private to uid {os.getuid()}")
        path.unlink(missing_ok=True)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(path))
        listener.listen(256)
    except OSError as exc:  # a read-only /tmp, a directory someone else made
        print(
            f"horovod_worker.preload: no socket at {path}: {exc}; ranks start as usual",
            file=sys.stderr,
            flush=True,
        )
        return 1
    import importlib
    import time

    if after_port is not None:
        wait_for_port(after_port)
    started = time.monotonic()
    try:
        with _one_blas_thread():
            for name in modules:
                importlib.import_module(name)
    except Exception as exc:  # any import error: ranks start as usual
        return _give_up(listener, path, f"importing {name} failed ({exc!r})")
    threads = thread_count()
    if threads > 1:
        # A fork keeps only the forking thread: a lock another thread held stays
        # held in the rank for good.
        return _give_up(listener, path, f"the imports left {threads} threads running")
    print(
        f"horovod_worker.preload: {', '.join(modules)} imported in "
        f"{time.monotonic() - started:.1f}s; ranks start from here ({path})",
        flush=True,
    )
    Preloader(listener).run()
    return 0


def _give_up(listener: socket.socket, path: Path, why: str) -> int:
    listener.close()
    path.unlink(missing_ok=True)
    print(f"horovod_worker.preload: {why}; ranks start as usual", file=sys.stderr, flush=True)
    return 1


def thread_count() -> int:
    """This process's threads, native ones included (Linux's /proc; 1 elsewhere)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


@contextlib.contextmanager
def _one_blas_thread() -> Iterator[None]:
    """NumPy's OpenBLAS starts its thread pool when it loads (torch imports NumPy),
    one thread less than the CPUs; with OPENBLAS_NUM_THREADS=1 it starts none and the
    preloader forks a process of one thread. A rank's NumPy BLAS then runs on one
    thread (torch's own threads are not affected)."""
    before = os.environ.get(BLAS_THREADS)
    os.environ[BLAS_THREADS] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(BLAS_THREADS, None)
        else:
            os.environ[BLAS_THREADS] = before


def start_beside(environ: Mapping[str, str] = os.environ, port: int | None = None) -> int | None:
    """Start the preloader in the background when HVJOB_PRELOAD asks for it (the
    worker pod's sshd does, before it execs sshd, with sshd's `port`); its pid."""
    if not preload_modules(environ):
        return None
    import subprocess

    after = ["--after-port", str(port)] if port is not None else []
    proc = subprocess.Popen(
        [sys.executable, "-m", "horovod_worker.preload", "serve", *after],
        stdin=subprocess.DEVNULL,
        env=dict(environ),
    )
    return proc.pid


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["serve"]:
        modules = preload_modules()
        if not modules:
            print(f"horovod_worker.preload: {PRELOAD_ENV} names no module", file=sys.stderr)
            return 2
        after = int(args[2]) if args[1:2] == ["--after-port"] and len(args) > 2 else None
        return serve(modules, socket_path(), after)
    if args[:1] == ["--"]:
        return client(args[1:])
    print(
        "usage: python -m horovod_worker.preload serve | -- COMMAND...\n"
        f"  serve: import the modules of {PRELOAD_ENV} and run ranks from them\n"
        "  -- COMMAND: run COMMAND from the preloader, or exec it when none can",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())
