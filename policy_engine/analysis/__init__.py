"""The reading side of policy-engine: what a run's manifests and traces say.

This package sits below the runtime (which uses it to summarise its own captures) and
imports nothing from the runtime, the integrations or the command line. Its public API:

- :func:`analyze` — every capture window of a run folder, compared across its ranks:
  step times, compute / communication / overlap / idle, the straggler, readiness. A trace
  whose rank wrote its summary to the manifest is not read again, so a run whose traces
  stayed on node-local disks (or were never kept: ``keep: summaries``) is analysed from
  its manifests alone. :meth:`RunAnalysis.to_json` is the document
  ``policy-engine analyze --format json`` prints (``schemas/analysis.schema.json``); its
  ``stalls`` answer a hung job from the stall records under the folder.
- :func:`compare` — two runs, window by window: what differs in how they were recorded,
  the change in step time split into its parts, the regions and operators that moved, the
  straggler then and now, and a verdict gated by the steps' own noise
  (:meth:`RunComparison.to_json` is ``policy-engine compare --format json``).
- :func:`step_timeline` — each training step end to end: every role's phases on every rank on
  one clock (the ranks' measured offsets to rank 0's applied), who waited for whom, the
  critical path (``RunAnalysis.timeline`` holds the same for :func:`analyze`).
- :func:`scan` — the run's capture windows and manifest records, nothing parsed.
- :func:`summarize` — one torch trace's per-rank figures (what a rank writes after a
  capture, and what :func:`analyze` reads when there is no summary).
- :class:`AnalysisError` — what was asked cannot be answered (no such folder, no traces,
  no window matching the role or step); the message says what there is instead.

Everything else in the package's modules is internal to it.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

from policy_engine.analysis.errors import AnalysisError

# The readers and the figures are imported when first used, not with the package: a
# command that only needs AnalysisError (every command imports it) starts without them.
if TYPE_CHECKING:
    from policy_engine.analysis.answers import (
        RankAnalysis,
        RunAnalysis,
        WindowAnalysis,
    )
    from policy_engine.analysis.comparison import RunComparison, WindowComparison
    from policy_engine.analysis.manifests import ManifestProblem
    from policy_engine.analysis.step_figures import StepFigures
    from policy_engine.analysis.summary import summarize
    from policy_engine.analysis.timeline import TimelineDoc

__all__ = ["AnalysisError", "RankAnalysis", "RunAnalysis", "RunComparison", "RunScan",
           "StepFigures", "WindowAnalysis", "WindowComparison", "WindowScan", "analyze",
           "compare", "scan", "step_timeline", "summarize"]

def analyze(path: str, *, role: str | None = None, step: int | None = None,
            jobs: int = 1, from_traces: bool = False) -> RunAnalysis:
    """The analysis of every capture window under the run folder ``path`` that ``role``
    and ``step`` choose, reading traces over ``jobs`` processes where their ranks wrote no
    summary (every trace when ``from_traces``). AnalysisError when nothing can be
    chosen."""
    from policy_engine.analysis.run import analyze_run

    return analyze_run(path, role=role, step=step, jobs=jobs, from_traces=from_traces)


def step_timeline(path: str, *, step: int | None = None, jobs: int = 1,
                  own_clocks: bool = False) -> TimelineDoc:
    """The step timeline of the run folder ``path`` (``policy-engine timeline --format
    json``: ``clock``, ``steps``, ``notes``), every training step or only ``step``;
    ``own_clocks``: each rank on its own clock, its measured offset not applied.
    AnalysisError when there is nothing to read."""
    from policy_engine.analysis.run import analyze_run

    result = analyze_run(path, step=step, jobs=jobs, own_clocks=own_clocks)
    result.close()
    assert result.timeline is not None  # analyze_run lays one out
    return copy.deepcopy(result.timeline)


def compare(base: str, new: str, *, role: str | None = None,
            steps: tuple[int, int] | None = None, jobs: int = 1,
            from_traces: bool = False) -> RunComparison:
    """Every window of the run under ``base`` matched in the one under ``new`` (by role,
    region and order; ``steps``: the base's step and the new run's), compared.
    AnalysisError, naming the run, when either has nothing to compare."""
    from policy_engine.analysis.compare import compare_runs

    return compare_runs(base, new, role=role, steps=steps, jobs=jobs, from_traces=from_traces)


@attrs.frozen
class WindowScan:
    """A capture window as the manifests record it: which ranks wrote a torch trace, and
    which of those summarised it (``summarised``; both in rank order), and what cannot
    be read."""

    title: str
    role: str
    region: str | None
    steps: tuple[Any, ...]
    cycle: int | None
    capture: int
    world: int | None
    ranks: tuple[int | None, ...]
    summarised: tuple[int | None, ...]
    skipped: tuple[Mapping[str, Any], ...]
    dropped: tuple[Mapping[str, Any], ...]


@attrs.frozen
class RunScan:
    """What the manifests under a run folder record, nothing parsed: its windows (oldest
    first), every record (each with ``event``, ``_manifest`` and ``_line``) and every
    line or file that could not be read."""

    windows: tuple[WindowScan, ...]
    records: tuple[Mapping[str, Any], ...]
    problems: tuple[ManifestProblem, ...]


def _ranks(found: Any) -> tuple[int | None, ...]:
    return tuple(sorted(found, key=lambda r: (not isinstance(r, int), r or 0)))


def scan(path: str) -> RunScan:
    """The windows and records of the manifests under ``path`` (an empty scan where there
    are none; unreadable lines are in ``problems``, never raised)."""
    from policy_engine.analysis.manifests import scan_manifests
    from policy_engine.analysis.windows import describe, from_manifests

    found = scan_manifests(path)
    windows, _problems, _notes = from_manifests(path, scan=found)
    return RunScan(
        windows=tuple(WindowScan(
            title=describe(w), role=w["role"], region=w["region"], steps=tuple(w["steps"]),
            cycle=w["cycle"], capture=w["capture"], world=w["world"],
            ranks=_ranks(t.rank for t in w["traces"]),
            summarised=_ranks(t.rank for t in w["traces"] if t.summary is not None),
            skipped=tuple(w["skipped"]), dropped=tuple(w["dropped"])) for w in windows),
        records=found.records, problems=found.problems)


_LATER = {"summarize": "summary", "RankAnalysis": "answers", "RunAnalysis": "answers",
          "StepFigures": "step_figures", "WindowAnalysis": "answers",
          "RunComparison": "comparison", "WindowComparison": "comparison"}


def __getattr__(name: str) -> Any:
    """The names above that are imported when first asked for (see the imports above)."""
    module = _LATER.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
