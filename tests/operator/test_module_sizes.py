"""The operator's modules stay small enough to read whole (#38): none but the API
models (api.py) and the object builders (builders.py), both long lists of fields,
passes 400 lines. A module that grows past it is split by concern, as children.py
was into children.py (ownership, sorting) and pod_state.py (what a pod says)."""

from __future__ import annotations

from localcluster.paths import REPO

PACKAGE = REPO / "operator" / "horovod_operator"
LIMIT = 400
LISTS_OF_FIELDS = {"api.py", "builders.py"}


def test_no_operator_module_but_the_models_and_builders_passes_400_lines() -> None:
    modules = sorted(PACKAGE.rglob("*.py"))
    assert len(modules) > 40, modules  # the package, not an empty glob
    long = {
        str(path.relative_to(PACKAGE)): lines
        for path in modules
        if path.name not in LISTS_OF_FIELDS
        and (lines := len(path.read_text().splitlines())) > LIMIT
    }
    assert long == {}, f"split these by concern: {long}"
