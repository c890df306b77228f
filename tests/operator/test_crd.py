"""The CRD and the API reference are generated from the models and never drift."""

from pathlib import Path
from typing import Any

import yaml

from horovod_operator import crd
from localcluster.paths import REPO


def walk(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    found: list[tuple[str, dict[str, Any]]] = []
    if isinstance(node, dict):
        found.append((path, node))
        for key, value in node.items():
            found += walk(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found += walk(value, f"{path}[{i}]")
    return found


def test_committed_files_match_the_models() -> None:
    assert crd.drifted(REPO) == [], "run: python -m horovod_operator.crd"
    assert crd.main(["--root", str(REPO), "--check"]) == 0


def test_check_reports_drift(tmp_path: Path) -> None:
    assert crd.main(["--root", str(tmp_path), "--check"]) == 1
    assert crd.main(["--root", str(tmp_path)]) == 0
    assert crd.main(["--root", str(tmp_path), "--check"]) == 0


def test_schema_is_structural() -> None:
    schema = crd.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in walk(schema):
        assert "$ref" not in node, path
        assert "anyOf" not in node and "allOf" not in node, path
        assert "title" not in node, path
        if "properties" in node:
            assert "additionalProperties" not in node, path
            assert node.get("type") == "object", path
    spec = schema["properties"]["spec"]
    # image may be empty: the operator then uses its --default-image.
    assert spec["required"] == ["command"]
    template = spec["properties"]["worker"]["properties"]["template"]
    assert template["x-kubernetes-preserve-unknown-fields"] is True
    limits = spec["properties"]["worker"]["properties"]["resources"]["properties"]["limits"]
    assert limits["additionalProperties"] == {"x-kubernetes-int-or-string": True}
    assert spec["properties"]["launchMode"]["enum"] == ["mpi", "gloo"]
    assert spec["properties"]["worker"]["properties"]["replicas"]["minimum"] == 1
    status = schema["properties"]["status"]
    assert not [path for path, node in walk(status) if "default" in node]


def test_names_columns_and_subresources() -> None:
    document = yaml.safe_load((REPO / "crds" / "horovod.ai_horovodjobs.yaml").read_text())
    assert document["metadata"]["name"] == "horovodjobs.horovod.ai"
    assert document["spec"]["names"]["shortNames"] == ["hvjob", "hj"]
    version = document["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns == {
        "Phase": ".status.phase",
        "Workers": ".status.workers.summary",
        "Restarts": ".status.restarts",
        "Step": ".status.progress.step",  # -o wide
        "Reason": ".status.reason",
        "Age": ".metadata.creationTimestamp",
    }


def test_api_reference_lists_every_field() -> None:
    text = (REPO / "docs" / "api.md").read_text()
    for field in ("slotsPerWorker", "launcherCreationPolicy", "cleanPodPolicy", "exitCode"):
        assert f"`{field}`" in text
