"""The status the agent reports for a pod: phase, conditions and container statuses.

Built from the runner's containers on every tick and PATCHed (a strategic
merge, as the kubelet does) only when it changed.
"""

from __future__ import annotations

import logging

from . import spec
from .kube import ApiError, Kube
from .spec import ContainerState, Obj

log = logging.getLogger("nodeagent.pod")


class StatusReporter:
    """One pod's status: built from its containers, sent when it differs from the last sent.

    Each condition keeps the time its value last changed (lastTransitionTime).
    """

    def __init__(self, kube: Kube, namespace: str, name: str, host_ip: str):
        self.kube = kube
        self.namespace, self.name = namespace, name
        self.host_ip = host_ip
        self.start_time = spec.now()
        self._transitions: dict[str, tuple[bool, str]] = {}
        # What the API server last accepted; None after a failed PATCH, so it is sent again.
        self.sent: Obj | None = None

    def build(
        self,
        *,
        restart_policy: str,
        init_done: bool,
        init_failed: bool,
        inits: list[ContainerState],
        mains: list[ContainerState],
        pod_ip: str,
    ) -> Obj:
        phase = spec.pod_phase(restart_policy, init_done, init_failed, mains)
        ready = phase == "Running" and all(c.ready for c in mains)
        initialized = init_done or not inits
        conditions = {
            "PodReadyToStartContainers": bool(pod_ip),
            "Initialized": initialized,
            "ContainersReady": ready,
            "Ready": ready,
            "PodScheduled": True,
        }
        out: list[Obj] = []
        for kind, ok in conditions.items():
            prev = self._transitions.get(kind)
            if prev is None or prev[0] != ok:
                self._transitions[kind] = (ok, spec.now())
            reason = None
            if not ok:
                reason = (
                    "PodCompleted"
                    if phase in ("Succeeded", "Failed")
                    else (
                        "ContainersNotInitialized"
                        if kind == "Initialized"
                        else "ContainersNotReady"
                    )
                )
            out.append(spec.condition(kind, ok, reason, self._transitions[kind][1]))
        status: Obj = {
            "phase": phase,
            "conditions": out,
            "hostIP": self.host_ip,
            "hostIPs": [{"ip": self.host_ip}],
            "startTime": self.start_time,
            "containerStatuses": [c.to_status() for c in mains],
        }
        if pod_ip:
            status["podIP"] = pod_ip
            status["podIPs"] = [{"ip": pod_ip}]
        if inits:
            status["initContainerStatuses"] = [c.to_status() for c in inits]
        return status

    def send(self, status: Obj) -> bool:
        """PATCH `status` unless it was sent already; False when the pod is gone (404).

        Any other failure is logged and left for the next call to send again.
        """
        if status == self.sent:
            return True
        self.sent = None
        try:
            self.kube.patch_pod_status(self.namespace, self.name, status)
            self.sent = status
        except ApiError as exc:
            if exc.status == 404:
                return False
            log.warning("%s/%s: status update failed: %s", self.namespace, self.name, exc)
        except Exception as exc:  # the API server unreachable for a moment: next tick
            log.warning("%s/%s: status update failed: %s", self.namespace, self.name, exc)
        return True

    def send_failed(self, status: Obj, reason: str, message: str) -> None:
        """PATCH `status` as phase Failed with `reason` and `message`; errors raise."""
        failed = {**status, "phase": "Failed", "reason": reason, "message": message}
        self.kube.patch_pod_status(self.namespace, self.name, failed)
