"""The Stalled message of many stuck pods: stable while the same causes hold."""

from __future__ import annotations

from horovod_operator.stalled import summarize

WHY = "0/4 nodes are available: 4 Insufficient nvidia.com/gpu."


def stuck(*indexes: int, why: str = WHY, reason: str = "Unschedulable") -> list[tuple[str, str]]:
    return [(reason, f"pod big-worker-{i}: {why}") for i in indexes]


def test_one_pod_is_named() -> None:
    assert summarize(stuck(7)) == ("Unschedulable", f"pod big-worker-7: {WHY}", "")


def test_many_pods_with_one_cause_give_one_message_whoever_they_are() -> None:
    early = summarize(stuck(*range(32, 300)))
    later = summarize(stuck(*range(40, 300)))  # the scheduler placed a few more
    assert early[:2] == later[:2] == ("Unschedulable", f"worker pods wait: {WHY}")
    # The Event says how many and names a few, in index order.
    assert early[2] == " (268 pods, e.g. big-worker-32, big-worker-33, big-worker-34)"
    assert later[2].startswith(" (260 pods, e.g. big-worker-40,")


def test_other_causes_are_named_by_reason_only() -> None:
    problems = [
        *stuck(3, 4),
        *stuck(5, why='Back-off pulling image "x"', reason="ImagePullBackOff"),
    ]
    reason, message, _ = summarize(problems)
    assert reason == "ImagePullBackOff"  # a fixed order: by reason
    assert message == 'pod big-worker-5: Back-off pulling image "x" (and more: Unschedulable)'


def test_a_refusal_comes_before_the_pods() -> None:
    refused = ("CreateForbidden", "the API server refused to create Pod big-worker-9: quota")
    reason, message, detail = summarize([*stuck(1, 2), refused])
    assert reason == "CreateForbidden"
    assert message == f"{refused[1]} (and more: Unschedulable)"
    assert detail == ""
