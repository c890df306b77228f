"""Derived names that must fit where Kubernetes puts them."""

from __future__ import annotations

from horovod_operator import names
from horovod_operator.validation import check_job_name


def test_a_gang_name_is_unchanged_while_it_fits() -> None:
    assert names.pod_group_name("mnist", 3, 8) == "mnist-gang-3-8"


def test_the_longest_job_name_gets_a_gang_name_that_fits_at_every_attempt() -> None:
    job = "j" * 54  # the longest name check_job_name allows (`<job>-launcher`)
    check_job_name(job, replicas=2)
    seen = set()
    for attempt in (0, 9, 10, 11, 123, 99_999):
        group = names.pod_group_name(job, attempt, 2048)
        assert len(group) <= names.LABEL_VALUE_MAX, group
        assert group.endswith(f"-gang-{attempt}-2048")
        assert group == names.pod_group_name(job, attempt, 2048)  # the same every time
        seen.add(group)
    assert len(seen) == 6  # distinct per attempt
    # Another long job with the same first characters gets another group.
    other = "j" * 53 + "k"
    assert names.pod_group_name(other, 10, 2048) != names.pod_group_name(job, 10, 2048)
