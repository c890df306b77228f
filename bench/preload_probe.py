"""Can a rank skip its imports? A probe for issue #39's first step (<= 0.8x).

Most of apply -> rank 0's first step, for us and for mpi-operator alike, is each
rank's interpreter start, `import torch, horovod.torch` and `hvd.init()`
(docs/benchmarks, "Apply -> first step"). A worker could do the imports while it
waits for the launcher: a process that has imported the framework forks one
child per rank that mpirun starts, and the child runs the training script with
the rank's environment, standard streams and working directory. This probe
checks that Open MPI accepts such a rank (it is not orted's child: orted's child
is a small client that hands its streams over and waits) and times it against
plain ranks, alternating, in the same run:

    python -m bench.preload_probe --repeats 5 --out .work/preload-probe.json

It needs Horovod and torch in this interpreter (hack/bootstrap.sh without
SKIP_WORKER) and mpirun on PATH. Nothing here is the product: the preloader is
not built into the worker image (see docs/benchmarks, "What would get to 0.8x").
"""

from __future__ import annotations

import argparse
import array
import atexit
import json
import os
import runpy
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

# The rank's work: the imports, init and one allreduce; "ready" is rank 0's first step.
RANK_SCRIPT = """\
import time
started = time.time()
import torch
import horovod.torch as hvd
hvd.init()
total = hvd.allreduce(torch.ones(2) * (hvd.rank() + 1), op=hvd.Sum)
assert total.tolist() == [3.0, 3.0], total
print(f"rank {hvd.rank()} of {hvd.size()} ready after {time.time() - started:.3f}s", flush=True)
"""


def serve(path: str) -> None:
    """Import the framework once, then fork a rank for every client that connects."""
    import horovod.torch  # noqa: F401  (the point: imported before any rank asks)
    import torch  # noqa: F401

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    print("preloaded", flush=True)
    while True:
        conn, _ = listener.accept()
        message, ancillary, _, _ = conn.recvmsg(1 << 20, socket.CMSG_SPACE(3 * 4))
        fds = array.array("i")
        for _level, _type, data in ancillary:
            fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
        request = json.loads(message)
        pid = os.fork()
        if pid == 0:
            listener.close()
            _run_rank(request, list(fds))
        for fd in fds:
            os.close(fd)
        threading.Thread(target=_report_exit, args=(conn, pid), daemon=True).start()


def _run_rank(request: dict[str, Any], fds: list[int]) -> None:
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    sys.argv = request["argv"]
    code = 0
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
    except SystemExit as ended:
        code = ended.code if isinstance(ended.code, int) else int(ended.code is not None)
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    # hvd's atexit hook calls MPI_Finalize: without it mpirun calls the rank's end
    # improper and fails the run.
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _report_exit(conn: socket.socket, pid: int) -> None:
    _, status = os.waitpid(pid, 0)
    conn.sendall(str(os.waitstatus_to_exitcode(status)).encode())
    conn.close()


def client(path: str, argv: list[str]) -> int:
    """What orted starts: hand the rank to the preloader, wait for its exit code."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(path)
    request = json.dumps({"argv": argv, "env": dict(os.environ), "cwd": os.getcwd()})
    streams = array.array("i", [0, 1, 2])
    conn.sendmsg([request.encode()], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, streams)])
    answer = conn.recv(16)
    return int(answer) if answer else 1


def _mpirun(rank_command: list[str], env: dict[str, str]) -> tuple[float, str]:
    argv = [
        "mpirun", "--allow-run-as-root", "-np", "2", "-H", "localhost:2",
        "-x", "PATH", "-x", "PRELOAD_SOCKET", *rank_command,
    ]  # fmt: skip
    started = time.monotonic()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    wall = time.monotonic() - started
    if done.returncode != 0 or "rank 0 of 2 ready" not in done.stdout:
        raise RuntimeError(f"mpirun failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return wall, done.stdout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path(".work/preload-probe.json"))
    sub = parser.add_subparsers(dest="role")
    sub.add_parser("serve").add_argument("socket")
    run = sub.add_parser("client")
    run.add_argument("argv", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    if args.role == "serve":
        serve(args.socket)
        return 0
    if args.role == "client":
        return client(os.environ["PRELOAD_SOCKET"], args.argv)

    with tempfile.TemporaryDirectory(prefix="preload-probe-") as scratch:
        script = Path(scratch) / "rank.py"
        script.write_text(RANK_SCRIPT)
        path = str(Path(scratch) / "preload.sock")
        env = dict(os.environ, PRELOAD_SOCKET=path)
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        server = subprocess.Popen(
            [sys.executable, "-m", "bench.preload_probe", "serve", path],
            stdout=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        try:
            assert server.stdout is not None
            if server.stdout.readline().strip() != "preloaded":
                raise RuntimeError("the preloader did not start")
            plain_cmd = [sys.executable, str(script)]
            preloaded_cmd = [sys.executable, "-m", "bench.preload_probe", "client", str(script)]
            runs: dict[str, list[float]] = {"plain": [], "preloaded": []}
            for i in range(args.repeats):
                for shape, command in (("plain", plain_cmd), ("preloaded", preloaded_cmd)):
                    wall, _ = _mpirun(command, env)
                    runs[shape].append(wall)
                    print(f"run {i + 1}/{args.repeats} {shape}: mpirun -np 2 took {wall:.2f}s")
        finally:
            server.terminate()
            server.wait(10)
    medians = {shape: statistics.median(walls) for shape, walls in runs.items()}
    result = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "load": os.getloadavg(),
        "runs": runs,
        "medians": medians,
        "ratio": medians["preloaded"] / medians["plain"],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"mpirun -np 2 to the end of the first allreduce, medians of {args.repeats}: plain "
        f"{medians['plain']:.2f}s, preloaded {medians['preloaded']:.2f}s "
        f"({result['ratio']:.2f}x); {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
