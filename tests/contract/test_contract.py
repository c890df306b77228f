"""The contract between operator and worker: standard library only, read by both,
and its result line survives what launchers do to output lines."""

from __future__ import annotations

import ast
import sys

import pytest

import horovod_contract as contract
from localcluster.paths import REPO

SOURCE = REPO / "contract" / "horovod_contract" / "__init__.py"


def test_imports_only_the_standard_library() -> None:
    imported = set()
    for node in ast.walk(ast.parse(SOURCE.read_text())):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert imported, "the parse found no imports at all"
    assert imported <= sys.stdlib_module_names, imported - sys.stdlib_module_names


def _code(folder: str) -> str:
    return "".join(p.read_text() for p in (REPO / folder).rglob("*.py"))


# Lines the trainers print and the demo, the tests and users parse (the operator
# reads RANK_PREFIX too, for the time to first step: progress.py).
PRINTED_LINES = ("RANK_PREFIX", "RESULT_PREFIX")


def test_every_name_is_read_by_both_sides() -> None:
    """A name only one side reads belongs to that side (operator/names.py, or the worker).
    The local node agent counts as the operator's side: it stands in for the
    cluster the operator's pods run on (it says when GPUs are pretend ones)."""
    operator_code, worker_code = _code("operator") + _code("localcluster"), _code("worker")
    names = [n for n in vars(contract) if n.isupper()]
    assert len(names) > 5
    for name in names:
        value = getattr(contract, name)
        if isinstance(value, tuple):
            # A command the operator puts in pods: the worker's side is the module it runs.
            assert f"contract.{name}" in operator_code, name
            module = value[value.index("-m") + 1]
            source = (REPO / "worker" / (module.replace(".", "/") + ".py")).read_text()
            for flag in (a for a in value if a.startswith("--") and a != "--"):
                assert f'"{flag}"' in source, f"{name}: {module} has no option {flag}"
            continue
        assert f"contract.{name}" in worker_code, f"{name}: the worker never reads it"
        assert f"contract.{name}" in operator_code or name in PRINTED_LINES, (
            f"{name}: the operator never reads it"
        )


@pytest.mark.parametrize(
    "prefix", ["", "[1,0]<stdout>:", "[0]<stdout>:", "worker-1: [1,0]<stdout>:"]
)
def test_a_result_line_round_trips_behind_launcher_prefixes(prefix: str) -> None:
    result = {"framework": "pytorch", "size": 2, "test_accuracy": 0.95}
    line = prefix + contract.result_line(result) + " [0,0]<stdout>:epoch 3"
    assert contract.result_in_line(line) == result
    assert contract.result_in_line(prefix + "epoch 1/2 loss 0.3") is None


def test_a_result_that_is_not_an_object_is_refused() -> None:
    with pytest.raises(ValueError, match="not a JSON object"):
        contract.result_in_line(f"{contract.RESULT_PREFIX} [1, 2]")
