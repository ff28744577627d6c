"""analysis/step_figures.py: a step's figures declared once, and every reader taking them
from the declaration."""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import pytest
from analysis_traces import make_summarised_run

from policy_engine.analysis import answers, window
from policy_engine.analysis.run import analyze_run
from policy_engine.analysis.step_figures import (
    ABOUT,
    FIGURES,
    SCHEMA,
    StepFigures,
    with_figures,
)
from policy_engine.analysis.summary import problem


def test_the_schema_file_holds_the_declaration() -> None:
    """``python -m policy_engine.analysis.step_figures`` wrote the file as it is."""
    schema = json.loads(Path(SCHEMA).read_text())
    assert with_figures(schema) == schema
    rank = schema["properties"]["windows"]["items"]["properties"]["ranks"]["items"]
    row = rank["properties"]["steps"]["items"]
    assert row["required"] == ["step", *FIGURES]
    assert rank["properties"]["total"]["required"] == list(FIGURES)
    for f in attrs.fields(StepFigures):
        assert row["properties"][f.name]["description"] == f.metadata[ABOUT]
    assert "gpu_timeline" in row["properties"]  # what is no figure is kept


def test_a_figure_the_declaration_drops_leaves_the_schema() -> None:
    schema = json.loads(Path(SCHEMA).read_text())
    rank = schema["properties"]["windows"]["items"]["properties"]["ranks"]["items"]
    rank["properties"]["steps"]["items"]["required"].append("gone_us")
    rank["properties"]["steps"]["items"]["properties"]["gone_us"] = {"type": "number"}
    fixed = with_figures(schema)
    row = fixed["properties"]["windows"]["items"]["properties"]["ranks"]["items"][
        "properties"]["steps"]["items"]
    assert "gone_us" not in row["properties"] and "gone_us" not in row["required"]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("run")
    make_summarised_run(str(root), 4, steps=3, ops=10, gpu=True)
    return str(root)


def test_every_reader_takes_the_declared_figures(run: str) -> None:
    """The typed rank, a rank's totals and the window's breakdown carry exactly the
    declared figures."""
    assert window.TOTALS == FIGURES
    result = analyze_run(run)
    try:
        w = result.windows[0]
        doc = w.docs[0]
        assert set(doc["steps"][0]) >= {"step", *FIGURES}
        assert tuple(doc["total"]) == FIGURES
        assert tuple(w.breakdown or {}) == FIGURES
        rank = w.ranks[0]
        assert isinstance(rank, answers.RankAnalysis)
        step = rank.steps[0]
        assert isinstance(step, StepFigures)
        assert [getattr(step, name) for name in FIGURES] == [doc["steps"][0][name]
                                                              for name in FIGURES]
    finally:
        result.close()


@pytest.mark.parametrize("name", FIGURES)
def test_a_summary_lacking_a_declared_figure_is_refused(run: str, name: str) -> None:
    result = analyze_run(run)
    try:
        doc = dict(result.windows[0].docs[0])
    finally:
        result.close()
    summary = {k: v for k, v in doc.items() if k not in ("rank", "path", "status", "total")}
    assert problem(summary, ops=False) is None
    del summary["steps"][1][name]
    assert problem(summary, ops=False) == "step 1 lacks a figure"
