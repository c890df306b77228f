"""crd_skew: the fields this operator writes that an older installed CRD lacks."""

from __future__ import annotations

import copy

from horovod_operator import crd, crd_skew
from horovod_operator.api import VERSION


def test_the_operators_own_crd_lacks_nothing() -> None:
    assert crd_skew.outdated(crd.crd(), crd.crd()) == []


def test_an_older_crd_names_each_missing_field_and_the_fix() -> None:
    old = copy.deepcopy(crd.crd())
    schema = old["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    del schema["properties"]["status"]["properties"]["uncountedRestarts"]
    failures = schema["properties"]["status"]["properties"]["failures"]["items"]["properties"]
    dropped = sorted(failures)[0]
    del failures[dropped]
    missing = crd_skew.outdated(old, crd.crd())
    assert missing == sorted(missing, key=missing.index)  # stable order
    assert "status.uncountedRestarts" in missing
    assert f"status.failures[].{dropped}" in missing
    text = crd_skew.message(missing)
    assert "older than this operator" in text and "kubectl apply --server-side" in text


def test_a_crd_that_does_not_serve_this_version_says_so() -> None:
    old = copy.deepcopy(crd.crd())
    old["spec"]["versions"][0]["name"] = "v1alpha0"
    assert crd_skew.outdated(old, crd.crd()) == [f"version {VERSION}"]


def test_unknown_fields_kept_by_the_installed_schema_are_not_missing() -> None:
    installed = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    own = {"type": "object", "properties": {"a": {"type": "string"}}}
    assert crd_skew.missing_fields(installed, own) == []
