"""`hvjob submit`: a HorovodJob from a local training script, with nothing to build.

The script goes into a ConfigMap (`<job>-script`, owned by the job once it
exists) mounted read-only into every worker at SCRIPT_DIR; each rank runs
`python SCRIPT_DIR/<script> ARGS…`. Pure: the client creates what this returns.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

from .. import names
from ..api import API_VERSION, KIND
from ..validation import GPU_RESOURCE

Obj = dict[str, Any]

SCRIPT_DIR: Final = "/opt/hvjob/script"
SCRIPT_VOLUME: Final = "hvjob-script"
# A ConfigMap holds at most 1 MiB; a training script that big is a package, not a script.
MAX_SCRIPT_BYTES: Final = 900 * 1024


class SubmitError(ValueError):
    """The script cannot be submitted as asked; the message says what to change."""


def script_configmap_name(job: str) -> str:
    return f"{job}-script"


def script_job(
    name: str,
    script: Path,
    args: list[str],
    *,
    workers: int = 1,
    gpus: int = 0,
    slots: int | None = None,
    image: str = "",
    python: str = "python",
) -> tuple[Obj, Obj]:
    """(ConfigMap, HorovodJob) manifests running `script` on `workers` pods with
    `gpus` GPUs each and one rank per GPU (or `slots` ranks; 1 without GPUs)."""
    if not script.is_file():
        raise SubmitError(f"{script}: no such file. Fix: give the path of a Python script")
    data = script.read_bytes()
    if len(data) > MAX_SCRIPT_BYTES:
        raise SubmitError(
            f"{script} is {len(data)} bytes; a ConfigMap holds under 1 MiB. Fix: build it "
            "into an image (Dockerfile.worker) and submit a manifest with spec.image"
        )
    try:
        text = data.decode()
    except UnicodeDecodeError:
        raise SubmitError(f"{script} is not UTF-8 text") from None
    ranks_per_worker = slots if slots is not None else max(gpus, 1)
    if gpus and ranks_per_worker > gpus:
        raise SubmitError(
            f"--slots {ranks_per_worker} is more than --gpus {gpus}: each rank needs its GPU"
        )
    configmap: Obj = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": script_configmap_name(name),
            "labels": {names.LABEL_JOB_NAME: name},
        },
        "data": {script.name: text},
    }
    worker: Obj = {
        "replicas": workers,
        "template": {
            "spec": {
                "volumes": [
                    {"name": SCRIPT_VOLUME, "configMap": {"name": script_configmap_name(name)}}
                ],
                "containers": [
                    {
                        "name": names.WORKER_CONTAINER,
                        "volumeMounts": [
                            {"name": SCRIPT_VOLUME, "mountPath": SCRIPT_DIR, "readOnly": True}
                        ],
                    }
                ],
            }
        },
    }
    if gpus:
        worker["resources"] = {"limits": {GPU_RESOURCE: gpus}}
    job: Obj = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name},
        "spec": {
            "image": image,
            "command": [python, f"{SCRIPT_DIR}/{script.name}", *args],
            "slotsPerWorker": ranks_per_worker,
            "worker": worker,
        },
    }
    return configmap, job


def owned_by(configmap: Obj, job: Obj) -> Obj:
    """The ConfigMap with the created job as its controller-less owner: deleting
    the job deletes the script."""
    meta = job["metadata"]
    owner = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": meta["name"],
        "uid": meta["uid"],
        "blockOwnerDeletion": False,
    }
    return {**configmap, "metadata": {**configmap["metadata"], "ownerReferences": [owner]}}
