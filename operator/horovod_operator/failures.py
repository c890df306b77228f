"""What a failed attempt means: each failure judged by runPolicy.podFailurePolicy.

Modelled on batch/v1 Job's podFailurePolicy: the first rule that matches a
failed pod decides its action (Ignore, Count, FailJob); a job fails at once on
any FailJob, restarts counting against backoffLimit on any Count, and restarts
without counting when every failure is ignored.

The default for a failure no rule matches differs from batch/v1 on purpose: a
disruption (preemption, eviction, a drain, a node shutdown, a pod deleted by
anyone but the operator) is ignored, anything else counts. A training job that
loses a GPU node to a drain has not failed, and its users should not have to
write a rule to keep its retry budget (kubeflow/mpi-operator #537, #651; JobSet
#918). A rule `{action: Count, onPodConditions: [{type: DisruptionTarget}]}`
restores batch/v1's behaviour.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from .api import Failure, PodFailurePolicy, PodFailurePolicyRule
from .pod_state import DISRUPTION_TARGET, has_condition

Action = Literal["Ignore", "Count", "FailJob"]
_SEVERITY: Final[dict[str, int]] = {"Ignore": 0, "Count": 1, "FailJob": 2}


@dataclass(frozen=True)
class Judged:
    failure: Failure
    action: Action
    why: str  # which rule, or the default that applied


def judge(
    pod: Mapping[str, Any] | None,
    failure: Failure,
    disruption: str | None,
    policy: PodFailurePolicy | None,
) -> Judged:
    """The action for one failure of `pod` (None: the pod is gone)."""
    if disruption is not None and failure.reason in (None, "Error"):
        failure = failure.model_copy(update={"reason": disruption})
    for index, rule in enumerate(policy.rules if policy else ()):
        if _matches(rule, pod, failure, disruption):
            return Judged(failure, rule.action, f"podFailurePolicy rule {index} ({rule.action})")
    if disruption is not None:
        return Judged(failure, "Ignore", f"a disruption ({disruption}) is not counted")
    return Judged(failure, "Count", "counted")


def _matches(
    rule: PodFailurePolicyRule,
    pod: Mapping[str, Any] | None,
    failure: Failure,
    disruption: str | None,
) -> bool:
    codes = rule.on_exit_codes
    if codes is not None:
        if failure.exit_code is None:
            return False
        if codes.container_name is not None and codes.container_name != failure.container:
            return False
        if codes.operator == "In":
            return failure.exit_code in codes.values
        return failure.exit_code != 0 and failure.exit_code not in codes.values
    for wanted in rule.on_pod_conditions or ():
        if pod is not None and has_condition(pod, wanted.type, wanted.status):
            return True
        # Every disruption counts as DisruptionTarget=True, also where the pod is
        # gone or an older kubelet only wrote the reason Evicted.
        is_disruption_target = (wanted.type, wanted.status) == (DISRUPTION_TARGET, "True")
        if disruption is not None and is_disruption_target:
            return True
    return False


def outcome(judged: Iterable[Judged]) -> Judged | None:
    """The decisive judgement: the most severe action, first of its kind."""
    found: Judged | None = None
    for item in judged:
        if found is None or _SEVERITY[item.action] > _SEVERITY[found.action]:
            found = item
    return found
