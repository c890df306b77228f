"""The chart's README is generated from values.yaml and must not drift from it."""

from __future__ import annotations

import yaml

from localcluster import chartdoc


def test_the_readme_is_up_to_date() -> None:
    values = (chartdoc.CHART / "values.yaml").read_text()
    assert chartdoc.README.read_text() == chartdoc.render(values), (
        "charts/horovod-operator/README.md is stale: python -m localcluster.chartdoc"
    )


def test_every_top_level_value_is_documented() -> None:
    values_text = (chartdoc.CHART / "values.yaml").read_text()
    documented = {key.split(".")[0] for key, _ in chartdoc.documented_values(values_text)}
    assert set(yaml.safe_load(values_text)) <= documented


def test_comments_continue_and_nest() -> None:
    text = "a:\n  # -- first line\n  # second line\n  b: 1\n# plain comment\nc: 2\n"
    assert chartdoc.documented_values(text) == [("a.b", "first line second line")]
