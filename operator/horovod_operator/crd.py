"""Generate the HorovodJob CRD and the API reference from the pydantic models.

``python -m horovod_operator.crd`` writes ``crds/horovod.ai_horovodjobs.yaml``
(and the same file into the Helm chart's crds/) and ``docs/api.md``; ``--check``
exits 1 when the committed files differ (CI).

CRD schemas must be structural: no ``$ref``, every node typed, no
``additionalProperties`` beside ``properties``. Pydantic's JSON schema is
rewritten into that form: references inlined, ``Optional`` turned into
``nullable``, ``int | str`` into ``x-kubernetes-int-or-string``, free-form
objects (pod templates) into ``x-kubernetes-preserve-unknown-fields``.
"""

from __future__ import annotations

import argparse
import sys
import types
import typing
from pathlib import Path
from typing import Any, Final

import yaml
from pydantic import BaseModel

from .api import (
    GROUP,
    KIND,
    PLURAL,
    SHORT_NAMES,
    SINGULAR,
    VERSION,
    HorovodJobSpec,
    HorovodJobStatus,
)
from .validation import ROOT_RULES

CRD_PATH: Final = Path("crds") / f"{GROUP}_{PLURAL}.yaml"
DOCS_PATH: Final = Path("docs") / "api.md"
# Helm installs CRDs from the chart's crds/ folder; it must hold the same file.
CHART_CRD_PATH: Final = Path("charts") / "horovod-operator" / CRD_PATH

Schema = dict[str, Any]


def _structural(node: Any, defs: dict[str, Any], keep_defaults: bool) -> Any:
    """Rewrite one pydantic JSON-schema node (recursively) into a structural schema."""
    if isinstance(node, list):
        return [_structural(item, defs, keep_defaults) for item in node]
    if not isinstance(node, dict):
        return node
    node = dict(node)
    if "$ref" in node:
        target = defs[node.pop("$ref").rsplit("/", 1)[-1]]
        merged = {**target, **node}  # a description beside the $ref wins
        return _structural(merged, defs, keep_defaults)
    if "allOf" in node and len(node["allOf"]) == 1:
        only = node.pop("allOf")[0]
        return _structural({**only, **node}, defs, keep_defaults)
    if "anyOf" in node:
        options = node.pop("anyOf")
        non_null = [o for o in options if o.get("type") != "null"]
        nullable = len(non_null) < len(options)
        types_ = sorted(o.get("type", "") for o in non_null)
        inner: Schema
        if types_ == ["integer", "string"]:
            inner = {"x-kubernetes-int-or-string": True}
        elif len(non_null) == 1:
            inner = dict(non_null[0])
        else:
            raise ValueError(f"cannot express anyOf {options!r} in a structural schema")
        merged = {**inner, **node}
        if nullable:
            merged["nullable"] = True
        return _structural(merged, defs, keep_defaults)

    result: Schema = {}
    for key, value in node.items():
        if key in ("title", "$defs"):
            continue
        if key == "default" and (value is None or not keep_defaults):
            continue
        if key == "additionalProperties":
            if value is True or (isinstance(value, dict) and not value):
                result["x-kubernetes-preserve-unknown-fields"] = True
            elif value is False:
                continue  # pruning and strict field validation reject unknown fields
            else:
                result[key] = _structural(value, defs, keep_defaults)
            continue
        if key == "properties":
            result[key] = {
                name: _structural(sub, defs, keep_defaults) for name, sub in value.items()
            }
            continue
        result[key] = _structural(value, defs, keep_defaults)
    return result


def model_schema(model: type[BaseModel], keep_defaults: bool) -> Schema:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    schema: Schema = _structural(raw, raw.get("$defs", {}), keep_defaults)
    return schema


def crd() -> dict[str, Any]:
    """The CustomResourceDefinition of HorovodJob."""
    spec = model_schema(HorovodJobSpec, keep_defaults=True)
    status = model_schema(HorovodJobStatus, keep_defaults=False)
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": list(SHORT_NAMES),
                "categories": ["all", "horovod"],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
                        {
                            "name": "Workers",
                            "type": "string",
                            "description": "Ready worker pods / worker pods",
                            "jsonPath": ".status.workers.summary",
                        },
                        {"name": "Restarts", "type": "integer", "jsonPath": ".status.restarts"},
                        {
                            # The training's latest step (docs/progress.md); -o wide.
                            "name": "Step",
                            "type": "integer",
                            "jsonPath": ".status.progress.step",
                            "priority": 1,
                        },
                        {
                            "name": "Reason",
                            "type": "string",
                            "description": "Why the job is in its phase, or what it waits for",
                            "jsonPath": ".status.reason",
                        },
                        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                    ],
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": "A Horovod training job: a launcher and workers.",
                            "required": ["spec"],
                            "x-kubernetes-validations": ROOT_RULES,
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": spec,
                                "status": status,
                            },
                        }
                    },
                }
            ],
        },
    }


def crd_yaml() -> str:
    header = "# Generated by `python -m horovod_operator.crd` from the models; do not edit.\n"
    return header + yaml.safe_dump(crd(), sort_keys=False, width=100)


# --- API reference -----------------------------------------------------------------------


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        names = [_type_name(a) for a in args if a is not type(None)]
        return " or ".join(names)
    if origin is typing.Literal:
        return " \\| ".join(f"`{a}`" for a in args)
    if origin is list:
        return f"list of {_type_name(args[0])}"
    if origin is dict:
        return "object" if args and args[1] is Any else f"map of {_type_name(args[1])}"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return f"[{annotation.__name__}](#{annotation.__name__.lower()})"
    return {int: "integer", str: "string", bool: "boolean"}.get(annotation, str(annotation))


def _models(root: type[BaseModel]) -> list[type[BaseModel]]:
    """The root and every model it reaches, in first-seen order."""
    seen: list[type[BaseModel]] = []

    def visit(model: type[BaseModel]) -> None:
        if model in seen:
            return
        seen.append(model)
        for field in model.model_fields.values():
            stack = [field.annotation]
            while stack:
                item = stack.pop()
                if isinstance(item, type) and issubclass(item, BaseModel):
                    visit(item)
                stack.extend(typing.get_args(item))

    visit(root)
    return seen


SPEC_CHANGES: Final = """## Changing a job's spec

The CRD refuses at apply time what it can (CEL rules: slots above the GPUs in
`worker.resources.limits`, a gang larger than the job, and the shape of a
started job).
What gets past it (a CRD from an older release, a template that cannot be a
pod template) and is invalid: a job that never started fails with
`InvalidSpec`; a started one gets the condition `SpecRejected`, a Warning Event,
and keeps running on the spec it last accepted. The operator never deletes a
pod because of an edit.
"""

# What an edit of each field does, by the job's phase (tests/operator/test_decide.py
# has a test per row).
EDIT_COLUMNS: Final = (
    "Field",
    "Before start (no status yet)",
    "Started (Pending, Starting, Running, Restarting)",
    "Suspended",
    "Finished (Succeeded, Failed)",
)
EDIT_TABLE: Final = (
    (
        "`worker.replicas`, `slotsPerWorker`, `launchMode`",
        "used",
        "refused by the CRD (`SpecRejected`/`ReplicasImmutable` where the CRD lacks the rule)",
        "used at resume",
        "ignored",
    ),
    (
        "`image`, `command`, `worker.resources`, `worker.template`, `launcher.template`, "
        "`scheduling`",
        "used",
        "used for pods created after the edit (the next restart); running pods are not replaced",
        "used at resume",
        "ignored",
    ),
    (
        "`runPolicy.backoffLimit`, `activeDeadlineSeconds`, `startupTimeoutSeconds`, "
        "`cleanPodPolicy`",
        "used",
        "apply at the next reconcile (the deadline counts from `status.startTime`)",
        "apply; the deadline clock is stopped",
        "`cleanPodPolicy` no longer acts",
    ),
    (
        "`runPolicy.ttlSecondsAfterFinished`",
        "used",
        "used when the job finishes",
        "used when the job finishes",
        "applies at once, from `status.completionTime`",
    ),
    (
        "`runPolicy.suspend`",
        "`true`: the job waits suspended",
        "`true`: pods deleted, phase Suspended",
        "`false`: resumes; `startTime` restarts, so the deadline counts from the resume",
        "ignored",
    ),
    (
        "an invalid value (fails the operator's validation)",
        "`Failed/InvalidSpec`, nothing created",
        "`SpecRejected`, the job runs on its last accepted spec",
        "`SpecRejected`",
        "ignored; a job that failed with `InvalidSpec` starts afresh when its spec is fixed",
    ),
)


def edit_table() -> str:
    rows = [EDIT_COLUMNS, tuple("---" for _ in EDIT_COLUMNS), *EDIT_TABLE]
    return "".join("| " + " | ".join(row) + " |\n" for row in rows)


def api_reference() -> str:
    """docs/api.md: one table per model, generated from the fields."""
    lines = [
        "# HorovodJob API reference (`horovod.ai/v1alpha1`)",
        "",
        "Generated by `python -m horovod_operator.crd` from the pydantic models in",
        "`operator/horovod_operator/api.py`; do not edit by hand.",
        "",
    ]
    for model in [*_models(HorovodJobSpec), *_models(HorovodJobStatus)]:
        lines += [f"## {model.__name__}", "", (model.__doc__ or "").strip(), ""]
        lines += ["| Field | Type | Default | Description |", "| --- | --- | --- | --- |"]
        for name, field in model.model_fields.items():
            alias = field.alias or name
            if field.is_required():
                default = "required"
            elif field.default_factory is not None:
                default = "{}" if field.default_factory not in (list,) else "[]"
            elif field.default is None:
                default = "-"
            else:
                default = f"`{field.default}`"
            description = (field.description or "").replace("|", "\\|")
            lines.append(
                f"| `{alias}` | {_type_name(field.annotation)} | {default} | {description} |"
            )
        lines.append("")
    return "\n".join(lines) + "\n" + SPEC_CHANGES + "\n" + edit_table()


# --- command line ------------------------------------------------------------------------


def generated_files() -> dict[Path, str]:
    crd_text = crd_yaml()
    return {CRD_PATH: crd_text, CHART_CRD_PATH: crd_text, DOCS_PATH: api_reference()}


def drifted(root: Path) -> list[Path]:
    """Generated files under `root` whose committed text differs from the models."""
    return [
        path
        for path, text in generated_files().items()
        if not (root / path).exists() or (root / path).read_text() != text
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m horovod_operator.crd", description=__doc__)
    parser.add_argument("--root", type=Path, default=Path.cwd(), help="repository root")
    parser.add_argument(
        "--check", action="store_true", help="exit 1 when the files differ from the models"
    )
    args = parser.parse_args(argv)
    if args.check:
        stale = drifted(args.root)
        for path in stale:
            print(f"{path} is out of date: run python -m horovod_operator.crd", file=sys.stderr)
        return 1 if stale else 0
    for path, text in generated_files().items():
        target = args.root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
