"""The contract between the operator and the worker image.

The operator writes pods that the worker image runs; both sides read these
names from here so that they cannot drift apart. This module imports nothing
beyond the standard library: the operator image has no torch or TensorFlow.
"""

from typing import Final

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

# The per-job ConfigMap (<job>-config) is mounted here.
CONFIG_MOUNT_PATH: Final = "/etc/horovod/config"
HOSTFILE: Final = "hostfile"
DISCOVER_HOSTS: Final = "discover_hosts.sh"

# Environment the operator sets on launcher and worker containers.
# The number of ranks the launcher starts (replicas x slotsPerWorker). Trainers
# compare hvd.size() with it and fail loudly on a mismatch, because a Horovod
# built with MPI but started without the Gloo controller silently runs every
# process as its own world of size 1.
ENV_EXPECTED_SIZE: Final = "HVJOB_EXPECTED_SIZE"
ENV_JOB_NAME: Final = "HVJOB_NAME"
ENV_JOB_NAMESPACE: Final = "HVJOB_NAMESPACE"
ENV_ROLE: Final = "HVJOB_ROLE"  # "launcher" or "worker"
ROLE_LAUNCHER: Final = "launcher"
ROLE_WORKER: Final = "worker"

# The trainer prints one final line "<RESULT_PREFIX> {json}" on rank 0, which
# the operator, the demo and users can parse (accuracy, loss, samples/s).
RESULT_PREFIX: Final = "HVJOB_RESULT"

# Every rank prints one line at start, "<RANK_PREFIX> rank=R size=N local_rank=L
# local_size=M hostname=H device=D", so that tests and users see where each rank
# ran and on which device (gpu:<i> or cpu).
RANK_PREFIX: Final = "HVJOB_RANK"

# Default worker command: prepares ssh key files with the modes sshd demands
# (Secret volumes are root-owned and group-readable) and execs sshd in the foreground.
WORKER_SSHD_COMMAND: Final = ("python", "-m", "horovod_worker.sshd")
