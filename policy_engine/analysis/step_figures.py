"""A rank's step figures, declared once.

:class:`StepFigures` is one ``ProfilerStep`` of one rank, in microseconds: each row of a
summary's ``steps``. Its fields are the figures, each with what it means; everything
else takes them from here:

- the summary writes them (``summary.py`` and ``npu_summary.py``: ``time_us`` from the
  ProfilerStep's range, every other figure from
  :func:`policy_engine.analysis.intervals.breakdown`);
- its check (:func:`policy_engine.analysis.summary.problem`) asks each of :data:`FIGURES`
  to be a number from 0;
- a window sums them per rank and spreads the sums across its ranks
  (:data:`policy_engine.analysis.window.TOTALS`);
- ``analyze``'s typed rank reads its steps as this class
  (:class:`policy_engine.analysis.answers.RankAnalysis`);
- the schema's step rows and totals (``schemas/analysis.schema.json``) are
  :func:`with_figures` of it: ``python -m policy_engine.analysis.step_figures`` writes
  them, and a test holds the file to this declaration;
- the type checker needs the names spelled: :data:`Figure` (a name) and
  :class:`FigureRow` (a summary's step row, ``summary.StepRow``, and a rank's totals are
  JSON of this shape) spell them, and importing this module checks both against the
  class.

A new figure is one field here (and its name in ``Figure`` and ``FigureRow``) and its
computation in ``breakdown``.
"""

from __future__ import annotations

import copy
import json
import os
import sys
from collections.abc import Mapping
from typing import Any, Literal, TypedDict, get_args

import attrs

#: A field's metadata: what the figure means (the schema's description).
ABOUT = "about"


def _figure(about: str) -> Any:
    return attrs.field(metadata={ABOUT: about})


@attrs.frozen
class StepFigures:
    """One ``ProfilerStep`` of one rank (``step`` None: the whole trace, which has none),
    in microseconds."""

    step: int | None = attrs.field(metadata={ABOUT: (
        "N of ProfilerStep#N; null when the trace has no ProfilerStep rows (the whole "
        "trace).")})
    time_us: float = _figure("The ProfilerStep's duration.")
    span_us: float = _figure(
        "The range the step view measures: the ProfilerStep's wall time on the host "
        "(equal to time_us).")
    compute_us: float = _figure(
        "Time some compute ran (GPU: kernels other than collectives and memory; CPU: "
        "operators other than collectives), counted once however many ran at once.")
    comm_us: float = _figure(
        "Time some collective ran (nccl*/hccl*/rccl* kernels; c10d, gloo, nccl, hccl "
        "operators and ranges on the CPU): in a synchronous step, waiting for the last "
        "rank plus the transfer.")
    overlap_us: float = _figure("Time compute and communication ran at once.")
    other_us: float = _figure("Time only other device work ran (memory copies and sets).")
    idle_us: float = _figure(
        "Time nothing ran within the step's host time: on a device, the device waiting "
        "while the host works (what says a step is host-bound).")

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> StepFigures:
        """A summary's step row (checked) as its figures."""
        return cls(row.get("step"), **{name: row[name] for name in FIGURES})


#: A figure's name: a key of a summary's step row (``summary.StepRow``) and of a rank's
#: totals; the fields above, in order (checked below).
Figure = Literal["time_us", "span_us", "compute_us", "comm_us", "overlap_us", "other_us",
                 "idle_us"]
#: The figures of a step, in the order a summary writes them.
FIGURES: tuple[Figure, ...] = get_args(Figure)
if tuple(f.name for f in attrs.fields(StepFigures) if f.name != "step") != FIGURES:
    raise TypeError("step_figures.Figure does not name StepFigures' fields in order")


class FigureRow(TypedDict):
    """The figures as JSON, in µs: a summary's step row holds them
    (``summary.StepRow``), a rank's totals are them summed (``window.totals``)."""

    time_us: float
    span_us: float
    compute_us: float
    comm_us: float
    overlap_us: float
    other_us: float
    idle_us: float


if tuple(FigureRow.__annotations__) != FIGURES:
    raise TypeError("step_figures.FigureRow does not name FIGURES in order")


class FigureProperty(TypedDict):
    """A step figure's property in the analysis schema (made by :func:`with_figures`)."""

    type: str
    description: str


def _properties() -> dict[str, FigureProperty]:
    return {f.name: {"type": "number", "description": f.metadata[ABOUT]}
            for f in attrs.fields(StepFigures) if f.name != "step"}


def with_figures(schema: Mapping[str, Any]) -> dict[str, Any]:
    """The analysis schema with its step rows and its ranks' totals as this declaration
    says: each figure required, a number, described; their other properties kept."""
    out = copy.deepcopy(dict(schema))
    rank = out["properties"]["windows"]["items"]["properties"]["ranks"]["items"]
    row = rank["properties"]["steps"]["items"]
    kept, figures = row["properties"], set(row["required"]) | set(FIGURES)
    row["required"] = ["step", *FIGURES]
    row["properties"] = {"step": kept["step"], **_properties(),  # then what is no figure
                         **{k: v for k, v in kept.items() if k != "step" and k not in figures}}
    total = rank["properties"]["total"]
    total["required"] = list(FIGURES)
    total["properties"] = _properties()
    return out


SCHEMA = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "schemas", "analysis.schema.json")


def main() -> int:
    """Write the declaration into ``schemas/analysis.schema.json`` (in a checkout)."""
    with open(SCHEMA, encoding="utf-8") as f:
        schema = json.load(f)
    text = json.dumps(with_figures(schema), indent=2) + "\n"
    with open(SCHEMA, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"{SCHEMA}: the step figures {', '.join(FIGURES)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
