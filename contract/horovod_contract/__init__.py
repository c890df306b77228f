"""The contract between the operator and the worker image, owned by neither.

The operator writes pods that the worker image runs. Only the names both sides
read live here: where the per-job ssh files are and what they are called, the
port sshd listens on, the commands the operator asks the image to run, the
environment the trainers check, and the lines trainers print that the operator,
the demo and users parse. Names only one side reads stay in that side's package.

Standard library only: the operator image installs neither torch nor TensorFlow,
and the worker image does not install kopf.
"""

import json
from collections.abc import Mapping
from typing import Any, Final

# sshd in worker pods listens here. Above 1024 so that a non-root worker can bind it.
SSH_PORT: Final = 2222

# The per-job SSH Secret (<job>-ssh) is mounted here in the launcher and every worker.
SSH_MOUNT_PATH: Final = "/etc/horovod/ssh"
SSH_PRIVATE_KEY: Final = "id_ed25519"
SSH_PUBLIC_KEY: Final = "id_ed25519.pub"
SSH_AUTHORIZED_KEYS: Final = "authorized_keys"
# The job's host key: every worker's sshd presents it, and the launcher's ssh
# accepts no other (known_hosts holds its public half).
SSH_HOST_KEY: Final = "ssh_host_ed25519_key"
SSH_KNOWN_HOSTS: Final = "known_hosts"

# The worker container's default command: prepares the key files with the modes
# sshd demands (Secret volumes are root-owned) and execs sshd in the foreground.
WORKER_SSHD_COMMAND: Final = ("python", "-m", "horovod_worker.sshd")
# The launcher's prefix: copies the client keys out of the Secret, puts an ssh
# that verifies the job's host key first on PATH, then execs what follows `--`.
LAUNCHER_SSH_CLIENT_COMMAND: Final = ("python", "-m", "horovod_worker.sshd", "--client-only", "--")
# horovodrun in the worker images: the same options and mpirun line, without the
# framework imports horovodrun spends finding out whether Horovod has MPI.
HOROVODRUN_COMMAND: Final = ("python", "-m", "horovod_worker.horovodrun")

# launchMode: gloo. No ssh: the launcher serves Horovod's Gloo rendezvous (an HTTP
# key-value store) on this port, and each worker starts its own ranks. Above 1024
# so that a non-root launcher can bind it.
GLOO_RENDEZVOUS_PORT: Final = 2223
# The launcher's command: reads the hostfile, serves the rendezvous for the plan
# it describes, and ends once every worker has reported that its ranks ended.
GLOO_LAUNCHER_COMMAND: Final = ("python", "-m", "horovod_worker.gloo_launcher")
# The worker's prefix: waits for the rendezvous, starts slotsPerWorker ranks of
# what follows `--` with Horovod's rank environment, exits with their result.
GLOO_WORKER_COMMAND: Final = ("python", "-m", "horovod_worker.gloo_worker", "--")
# What a gloo worker is told about its place in the job (set by the operator).
ENV_GLOO_RENDEZVOUS: Final = "HVJOB_GLOO_RENDEZVOUS"  # <launcher host>:<port>
ENV_GLOO_RENDEZVOUS_TIMEOUT: Final = "HVJOB_GLOO_RENDEZVOUS_TIMEOUT"  # seconds to wait for it
ENV_WORKER_INDEX: Final = "HVJOB_WORKER_INDEX"  # 0 .. replicas-1
ENV_WORKER_HOST: Final = "HVJOB_WORKER_HOST"  # the worker's name in the launcher's plan
ENV_WORKER_COUNT: Final = "HVJOB_WORKER_COUNT"  # replicas
ENV_SLOTS_PER_WORKER: Final = "HVJOB_SLOTS_PER_WORKER"

# Elastic jobs (spec.elastic, launchMode gloo). The launcher runs Horovod's elastic
# driver; instead of ssh, each worker pod runs an agent that the driver asks, over
# HTTP on this port, to start and stop the pod's ranks (and whether the pod can
# take ranks at all: the pod's readiness probe asks the same question).
ELASTIC_AGENT_PORT: Final = 2224
# The agent's path that answers 200 while the pod can take ranks, 503 once it stops.
ELASTIC_READY_PATH: Final = "/ready"
# The worker's prefix in an elastic job: the agent, running what follows `--`.
ELASTIC_AGENT_COMMAND: Final = ("python", "-m", "horovod_worker.elastic_agent", "--")
# The launcher's command: the elastic driver, with the agents to ask in --agents
# (one <host>:<port> per line: every worker the job may have, up to maxReplicas).
ELASTIC_LAUNCHER_COMMAND: Final = ("python", "-m", "horovod_worker.elastic_launcher")

# The number of ranks the launcher starts (replicas x slotsPerWorker). Trainers
# compare hvd.size() with it and fail loudly on a mismatch, because a Horovod
# built with MPI but started without the Gloo controller silently runs every
# process as its own world of size 1.
ENV_EXPECTED_SIZE: Final = "HVJOB_EXPECTED_SIZE"

# The GPUs each worker pod asked for (set by the operator only when it asked for
# some). A rank that then sees none refuses to train on the CPU: a missing device
# plugin or runtime class must not pass for a slow success.
ENV_GPUS_PER_WORKER: Final = "HVJOB_GPUS_PER_WORKER"
# "1": training on the CPU is expected even so (the trainers' --allow-cpu; the
# local node agent sets it, its GPUs being pretend ones).
ENV_ALLOW_CPU: Final = "HVJOB_ALLOW_CPU"

# Every rank prints one line at start, "<RANK_PREFIX> rank=R size=N local_rank=L
# local_size=M hostname=H device=D", so that tests and users see where each rank
# ran and on which device (gpu:<i> or cpu).
RANK_PREFIX: Final = "HVJOB_RANK"

# Rank 0 prints one final line "<RESULT_PREFIX> {json}" (accuracy, loss, samples/s).
RESULT_PREFIX: Final = "HVJOB_RESULT"


def result_line(result: Mapping[str, Any]) -> str:
    """The one line a trainer prints with its result."""
    return f"{RESULT_PREFIX} {json.dumps(result, sort_keys=True)}"


def result_in_line(line: str) -> dict[str, Any] | None:
    """The result a line carries, wherever the marker sits in it (launchers prefix
    lines with rank tags), or None when it carries none. Anything after the JSON
    object is ignored: another rank's output may follow it on the same line."""
    marker = f"{RESULT_PREFIX} "
    at = line.find(marker)
    if at < 0:
        return None
    text = line[at + len(marker) :]
    parsed, _ = json.JSONDecoder().raw_decode(text)
    if not isinstance(parsed, dict):
        raise ValueError(f"{RESULT_PREFIX} is not a JSON object: {text[:80]}")
    return parsed
