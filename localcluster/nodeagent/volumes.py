"""A pod's volumes: their files, written under the pod's directory before a container starts.

Secret, ConfigMap, downwardAPI and projected volumes become files with their
modes (spec.py decides which files); an emptyDir is an empty directory every
user may write. A hostPath volume needs nothing here: the container mounts the
host's path itself (mounts.py).
"""

from __future__ import annotations

from pathlib import Path

from . import spec
from .kube import Kube
from .spec import Obj, VolumeFile


def write_volumes(root: Path, pod: Obj, kube: Kube, pod_ip: str, host_ip: str) -> None:
    """Every volume of `pod` under root/<volume name>.

    Raises ValueError (an unsupported kind, a missing key), or what the API
    server answered, when a volume cannot be made yet; writing again is harmless.
    """
    namespace = pod["metadata"]["namespace"]
    for volume in pod["spec"].get("volumes") or []:
        target = root / volume["name"]
        if "hostPath" in volume:
            continue
        target.mkdir(parents=True, exist_ok=True)
        files: list[VolumeFile] = []
        if "secret" in volume:
            src = volume["secret"]
            obj = kube.object_data("secretRef", namespace, src["secretName"])
            files = spec.secret_files(obj, src)
        elif "configMap" in volume:
            src = volume["configMap"]
            obj = kube.object_data("configMapRef", namespace, src["name"])
            files = spec.config_map_files(obj, src)
        elif "downwardAPI" in volume:
            files = spec.downward_files(pod, volume["downwardAPI"], pod_ip, host_ip)
        elif "projected" in volume:
            files = projected_files(volume["projected"], pod, kube, pod_ip, host_ip)
        elif "emptyDir" in volume:
            target.chmod(0o777)
        else:
            kinds = sorted(set(volume) - {"name"})
            raise ValueError(f"volume {volume['name']!r}: {kinds} is not supported")
        for f in files:
            path = target / f.path
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(f.content)
            path.chmod(f.mode)


def projected_files(
    projected: Obj, pod: Obj, kube: Kube, pod_ip: str, host_ip: str
) -> list[VolumeFile]:
    """The files of a projected volume: its sources' files, and service account tokens."""
    namespace = pod["metadata"]["namespace"]
    default_mode = projected.get("defaultMode", spec.DEFAULT_FILE_MODE)
    files: list[VolumeFile] = []
    for source in projected.get("sources") or []:
        if "secret" in source:
            src = {
                "defaultMode": default_mode,
                **source["secret"],
                "secretName": source["secret"]["name"],
            }
            obj = kube.object_data("secretRef", namespace, src["name"])
            files += spec.secret_files(obj, src)
        elif "configMap" in source:
            src = {"defaultMode": default_mode, **source["configMap"]}
            obj = kube.object_data("configMapRef", namespace, src["name"])
            files += spec.config_map_files(obj, src)
        elif "downwardAPI" in source:
            src = {"defaultMode": default_mode, **source["downwardAPI"]}
            files += spec.downward_files(pod, src, pod_ip, host_ip)
        elif "serviceAccountToken" in source:
            src = source["serviceAccountToken"]
            token = kube.service_account_token(
                namespace,
                pod["spec"].get("serviceAccountName") or "default",
                pod,
                src.get("audience"),
                int(src.get("expirationSeconds", 3600)),
            )
            files.append(VolumeFile(src["path"], token.encode(), default_mode))
    return files
