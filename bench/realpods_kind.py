"""Apply -> first step -> Succeeded on real kubelets: ours and mpi-operator on kind.

bench.realpods times one Horovod program under both operators on the node agent
(pods as host processes). This is the same measure on kind: a real kubelet,
containerd and runc, images, cluster DNS and the CNI's network. Both operators
run the digits trainer (PyTorch on the CPU, 2 workers x 1 slot) from the same
worker image:

- **ours**: a HorovodJob of our own (our sshd as uid 1000, our launcher), from
  the operator tests/e2e/kind/run.sh installed with the chart;
- **mpi-operator**: the MPIJob of tests/testdata/mpijob-horovod.yaml as its
  users write it (`mpirun` as root in the launcher, `sshd -De` as root in the
  workers, `launcherCreationPolicy: WaitForWorkersReady`), under mpi-operator
  v0.8.0 as a process beside kind, at our client rate, its work queue
  unthrottled.

mpi-operator's example images bake in what its workers' sshd needs: host keys,
/var/run/sshd, `StrictModes no` and an ssh client that checks no host keys.
Ours removes its host keys (each job's Secret brings one). So the MPIJob gets
them here without a new image: a host key from a Secret (`sshd -h`), the
directory made before sshd starts (one `sh`), `-o StrictModes=no`, and the
client settings as an ssh_config.d drop-in.

    python -m bench.realpods_kind --kubeconfig K --image IMAGE [--repeats 3] [--out F]

tests/e2e/kind/run.sh runs it after the examples when REALPODS_REPEATS is set
(`make bench-realpods-kind`; the kind test runs it once).
"""

from __future__ import annotations

import argparse
import base64
import functools
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Final

import yaml

from horovod_operator.sshkeys import generate_key_pair
from localcluster import crds
from localcluster.kube import ApiError, Client
from localcluster.paths import REPO
from localcluster.poll import wait_for
from localcluster.processes import port_held

from . import manifests, procs, realpods
from .run import operator_specs

Obj = dict[str, Any]

MPIJOB: Final = REPO / "tests" / "testdata" / "mpijob-horovod.yaml"
PROGRAM: Final = ["python", "-m", "horovod_worker.train", "--framework=pytorch", "--threads=1"]
WORKERS: Final = 2
NAMESPACE: Final = "realpods"
HOST_KEY_SECRET: Final = "mpijob-sshd-host-key"
HOST_KEY_DIR: Final = "/etc/ssh/hostkey"
SSH_CLIENT_CONFIG: Final = "mpijob-ssh-client"
# What mpi-operator's base image writes into its ssh_config: ~/.ssh is a read-only
# Secret, so no host key is checked or written.
IMAGE_SSH_CONFIG: Final = "Host *\n    StrictHostKeyChecking no\n    UserKnownHostsFile /dev/null\n"
LABELS: Final = {
    "ours": "horovod-operator (its own sshd and launcher)",
    "ours-preloaded": "horovod-operator, ranks forked from a preloaded interpreter (HVJOB_PRELOAD)",
    "mpi-operator": "mpi-operator v0.8.0 (WaitForWorkersReady, work queue unthrottled)",
}
PREFIX: Final = {"ours": "hv", "ours-preloaded": "hvp", "mpi-operator": "mpi"}
IMPORTS: Final = ("torch", "horovod.torch")
PRELOAD: Final = ",".join(IMPORTS)


def horovod_job(name: str, image: str) -> Obj:
    """The program as a HorovodJob: the operator's defaults for everything else."""
    return {
        "apiVersion": manifests.HVJOB_API,
        "kind": "HorovodJob",
        "metadata": {"name": name},
        "spec": {
            "image": image,
            "command": list(PROGRAM),
            "slotsPerWorker": 1,
            "worker": {"replicas": WORKERS},
            "runPolicy": {"cleanPodPolicy": "Running", "backoffLimit": 0},
        },
    }


def preloaded_job(name: str, image: str) -> Obj:
    """The HorovodJob with HVJOB_PRELOAD on both roles (horovod_worker.preload): the
    workers import the framework while they wait, and each rank is forked from them."""
    job = horovod_job(name, image)
    env = [{"name": "HVJOB_PRELOAD", "value": PRELOAD}]
    for role in ("worker", "launcher"):
        # The launcher has no section of its own in horovod_job: the operator's defaults.
        template = {"spec": {"containers": [{"name": role, "env": env}]}}
        job["spec"].setdefault(role, {})["template"] = template
    return job


def mpi_job(name: str, image: str) -> Obj:
    """The testdata MPIJob on `image`, with what mpi-operator's images bake in."""
    job: Obj = yaml.safe_load(MPIJOB.read_text())
    job["metadata"] = {"name": name}
    spec = job["spec"]
    spec["launcherCreationPolicy"] = "WaitForWorkersReady"
    replicas = spec["mpiReplicaSpecs"]
    launcher = replicas["Launcher"]["template"]["spec"]
    args = launcher["containers"][0]["args"]
    assert args[-2:] == ["python", "/examples/tensorflow_mnist.py"], args
    # The image puts its trainer on PYTHONPATH, which an ssh session does not inherit:
    # passed on as the MPIJob passes PATH.
    args[-2:] = ["-x", "PYTHONPATH", *PROGRAM]
    launcher["volumes"] = [{"name": "ssh-client", "configMap": {"name": SSH_CLIENT_CONFIG}}]
    launcher["containers"][0]["volumeMounts"] = [
        {"name": "ssh-client", "mountPath": "/etc/ssh/ssh_config.d", "readOnly": True}
    ]
    worker = replicas["Worker"]["template"]["spec"]
    sshd = worker["containers"][0]
    assert sshd["command"] == ["/usr/sbin/sshd"] and sshd["args"] == ["-De"], sshd
    sshd["command"] = ["/bin/sh", "-c"]
    sshd["args"] = [
        "mkdir -p /run/sshd && exec /usr/sbin/sshd -De "
        f"-h {HOST_KEY_DIR}/ssh_host_ed25519_key -o StrictModes=no"
    ]
    worker["volumes"] = [
        {"name": "host-key", "secret": {"secretName": HOST_KEY_SECRET, "defaultMode": 0o600}}
    ]
    sshd["volumeMounts"] = [{"name": "host-key", "mountPath": HOST_KEY_DIR, "readOnly": True}]
    for role in ("Launcher", "Worker"):
        pod = replicas[role]["template"]["spec"]
        container = pod["containers"][0]
        container["image"] = image
        container["imagePullPolicy"] = "IfNotPresent"
        # A kind node's two cores hold the control plane too: no CPU requests, as ours.
        container.pop("resources", None)
        # mpi-operator's images run as root; ours as uid 1000 unless told.
        pod["securityContext"] = {"runAsUser": 0, "runAsGroup": 0}
    return job


def mpi_prerequisites(client: Client, namespace: str) -> None:
    """The MPIJob's host key and ssh client settings (what its image would bring)."""
    key = generate_key_pair("mpijob-sshd")
    objects = [
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": HOST_KEY_SECRET},
            "data": {
                "ssh_host_ed25519_key": base64.b64encode(key.private_openssh.encode()).decode()
            },
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": SSH_CLIENT_CONFIG},
            "data": {"mpi-operator-image.conf": IMAGE_SSH_CONFIG},
        },
    ]
    for obj in objects:
        plural = "secrets" if obj["kind"] == "Secret" else "configmaps"
        try:
            client.create(f"/api/v1/namespaces/{namespace}/{plural}", obj)
        except ApiError as error:
            if error.status != 409:
                raise


def kubectl(kubeconfig: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["kubectl", f"--kubeconfig={kubeconfig}", *args],
        capture_output=True,
        text=True,
        check=check,
        timeout=120,
    )


def ensure_namespace(client: Client, namespace: str) -> None:
    try:
        client.create("/api/v1/namespaces", {"metadata": {"name": namespace}})
    except ApiError as error:
        if error.status != 409:
            raise


def install_mpijob_crd(kubeconfig: Path) -> None:
    kubectl(kubeconfig, "apply", "--server-side", "--force-conflicts", "-f", str(procs.mpi_crd()))
    crds.wait_established(functools.partial(kubectl, kubeconfig), ["mpijobs.kubeflow.org"])


def timed(
    client: Client, kubeconfig: Path, namespace: str, key: str, job: Obj, timeout: float
) -> dict[str, Any]:
    """One job to its end (bench.realpods.run_one), then deleted with its pods."""
    ours = key.startswith("ours")
    kind = "horovodjobs" if ours else "mpijobs"
    path = (
        f"/apis/{manifests.HVJOB_API}/namespaces/{namespace}/{manifests.HVJOB_PLURAL}"
        if ours
        else f"/apis/{manifests.MPIJOB_API}/namespaces/{namespace}/{manifests.MPIJOB_PLURAL}"
    )
    phase_of = manifests.horovod_phase if ours else manifests.mpi_phase
    logs: list[str] = []

    def launcher_log(pod: str) -> str:
        done = subprocess.run(
            ["kubectl", f"--kubeconfig={kubeconfig}", "logs", "--timestamps", pod,
             "-n", namespace],
            capture_output=True, text=True, check=False, timeout=60,
        )  # fmt: skip
        logs.append(done.stdout or done.stderr)
        return logs[-1]

    def finished(obj: Obj) -> str | None:
        phase = phase_of(obj)
        return phase if phase in ("Succeeded", "Failed") else None

    name = job["metadata"]["name"]
    run = realpods.run_one(client, namespace, path, job, WORKERS, finished, launcher_log, timeout)
    if run["phase"] != "Succeeded":
        run["launcher_log_tail"] = (logs[-1] if logs else "")[-2000:]
    # A preloaded rank says nothing; one that started its own interpreter says why.
    run["preload_fallbacks"] = [
        line for line in (logs[-1] if logs else "").splitlines() if "horovod_worker.preload" in line
    ]
    kubectl(kubeconfig, "delete", kind, name, "-n", namespace, "--wait=false")

    def gone() -> bool:
        pods = client.request("GET", f"/api/v1/namespaces/{namespace}/pods")[1]["items"]
        return not any(p["metadata"]["name"].startswith(f"{name}-") for p in pods)

    wait_for(gone, 180, 1.0, f"the pods of {name} to be gone")
    return run


def import_seconds(kubeconfig: Path, namespace: str, image: str) -> float | None:
    """A fresh interpreter's import of torch and horovod.torch in the image, on the node:
    the share of "-> first step" every rank spends before Horovod starts."""
    code = (
        "import time, subprocess, sys; t = []\n"
        "for _ in range(3):\n"
        "    s = time.monotonic()\n"
        f"    subprocess.run([sys.executable, '-c', 'import {', '.join(IMPORTS)}'], check=True)\n"
        "    t.append(time.monotonic() - s)\n"
        "print('IMPORT', sorted(t)[1])"
    )
    name = f"imports-{int(time.time())}"
    done = subprocess.run(
        ["kubectl", f"--kubeconfig={kubeconfig}", "run", name, "-n", namespace, "--rm", "-i",
         "--restart=Never", f"--image={image}", "--image-pull-policy=IfNotPresent",
         "--command", "--", "python", "-c", code],
        capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    for line in done.stdout.splitlines():
        if line.startswith("IMPORT "):
            return round(float(line.split()[1]), 2)
    print(f"[realpods-kind] import timing failed: {done.stderr[-500:]}", file=sys.stderr)
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.realpods_kind",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--kubeconfig", required=True, type=Path)
    parser.add_argument("--image", required=True, help="the torch CPU worker image, loaded")
    parser.add_argument("--namespace", default=NAMESPACE)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=600, help="seconds per job")
    parser.add_argument("--out", type=Path, help="write the runs and the table here (JSON)")
    parser.add_argument("--logs", type=Path, default=Path(".work/realpods-kind"))
    args = parser.parse_args(argv)

    def say(message: str) -> None:
        print(f"[realpods-kind] {message}", file=sys.stderr, flush=True)

    args.logs.mkdir(parents=True, exist_ok=True)
    client = Client(args.kubeconfig)
    ensure_namespace(client, args.namespace)
    mpi_prerequisites(client, args.namespace)
    say("mpi-operator v0.8.0: building (cached) and starting beside the cluster")
    procs.build_mpi_operator()
    install_mpijob_crd(args.kubeconfig)
    (spec,) = operator_specs(50, 100, ["mpi-tuned"])  # our operator's default client rate
    mpi = procs.MpiOperatorProcess(
        spec, args.kubeconfig, args.namespace, args.logs / "mpi-operator.log"
    )
    makers = {"ours": horovod_job, "ours-preloaded": preloaded_job, "mpi-operator": mpi_job}
    runs: dict[str, list[dict[str, Any]]] = {key: [] for key in makers}
    failed: list[str] = []
    # mpi-operator's /healthz port is fixed, and under hack/test.sh the other pytest
    # stream may run it at the same time (the quick benchmark, tests/e2e/test_realpods.py):
    # wait for it. CI's run of e709365 failed the kind rung while the benchmark ran.
    with port_held(procs.MPI_HEALTH_PORT):
        try:
            mpi.start_and_wait(timeout=120)
            for i in range(args.repeats):
                for key, make in makers.items():
                    name = f"{PREFIX[key]}-digits-{i}"
                    job = make(name, args.image)
                    run = timed(client, args.kubeconfig, args.namespace, key, job, args.timeout)
                    say(f"{name}: {run['phase']}, milestones {run['milestones']}")
                    if run["phase"] != "Succeeded":
                        failed.append(f"{name}: {run['phase']}\n{run.get('launcher_log_tail', '')}")
                    elif key == "ours-preloaded" and run["preload_fallbacks"]:
                        failed.append(f"{name}: ranks not preloaded: {run['preload_fallbacks']}")
                    runs[key].append(run)
        finally:
            mpi.stop(timeout=30)
            client.close()
    imports = import_seconds(args.kubeconfig, args.namespace, args.image)
    text = realpods.table(runs, LABELS)
    print(f"\n{text}\n(import {' + '.join(IMPORTS)} in the image: {imports} s per interpreter)")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        result = {
            "runs": runs,
            "median": realpods.summary(runs),
            "import_seconds": imports,
            "imports": list(IMPORTS),
            "workers": WORKERS,
            "image": args.image,
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "table": text,
        }
        args.out.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
        say(f"wrote {args.out}")
    for failure in failed:
        say(f"not Succeeded: {failure}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
