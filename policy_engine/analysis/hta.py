"""Holistic Trace Analysis beside ours (``analyze --hta``), for windows with GPU kernels.

HTA reads a folder of traces, one per rank; a window's traces are linked into a
temporary folder so that HTA sees that window only. Its temporal breakdown and
communication/computation overlap are put beside our numbers; anything HTA raises is
reported as the window's HTA error, never as ours.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import tempfile
import warnings
from collections.abc import Iterable
from typing import Any, TypedDict

from policy_engine.analysis.format import rank_spans
from policy_engine.analysis.summary import RankEntry

INSTALL = "pip install HolisticTraceAnalysis"


class HtaRank(TypedDict):
    """One rank's figures from HTA, in µs (made by :func:`run_hta`); None: HTA gave none."""

    rank: int
    compute_us: float | None
    non_compute_us: float | None
    idle_us: float | None
    kernel_us: float | None
    overlap_pct: float | None  # HTA's comm/comp overlap: % of communication time


class _HtaKeys(TypedDict):
    """The keys of every :class:`HtaAnswer`."""

    error: str | None  # why HTA was not run or failed; None: it ran


class HtaAnswer(_HtaKeys, total=False):
    """HTA's numbers for one window (``analyze --hta``), made by :func:`run_hta`."""

    ranks: list[HtaRank]  # by rank; empty or absent when HTA did not run


def available() -> bool:
    try:
        import hta.trace_analysis  # type: ignore[import-untyped,import-not-found,unused-ignore]  # noqa: F401
    except ImportError:
        return False
    return True


def _number(value: Any) -> float | None:
    try:
        return round(float(value), 3)
    except (TypeError, ValueError):
        return None


def run_hta(files: list[str]) -> HtaAnswer:
    """HTA's temporal breakdown and comm/comp overlap of the traces ``files``."""
    try:
        from hta.trace_analysis import (  # type: ignore[import-untyped,import-not-found,unused-ignore]
            TraceAnalysis,
        )
    except ImportError:
        return {"error": f"HTA is not installed ({INSTALL})"}
    with tempfile.TemporaryDirectory(prefix="policy-engine-hta-") as folder:
        for index, path in enumerate(files):  # numbered: two ranks' names may be alike
            os.symlink(os.path.abspath(path),
                       os.path.join(folder, f"{index}_{os.path.basename(path)}"))
        quiet = io.StringIO()
        level = logging.getLogger().level
        try:
            logging.getLogger().setLevel(logging.ERROR)
            with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet), \
                    warnings.catch_warnings():
                warnings.simplefilter("ignore")  # its dependencies' deprecations
                analysis = TraceAnalysis(trace_dir=folder)
                breakdown = analysis.get_temporal_breakdown(visualize=False)
                overlap = analysis.get_comm_comp_overlap(visualize=False)
        except Exception as err:  # HTA's failure is its own, reported as such
            return {"error": f"HTA failed: {type(err).__name__}: {err}"}
        finally:
            logging.getLogger().setLevel(level)
    shares = {int(row["rank"]): _number(row.get("comp_comm_overlap_pctg"))
              for row in overlap.to_dict("records")}
    ranks: list[HtaRank] = []
    for row in breakdown.to_dict("records"):
        rank = int(row["rank"])
        ranks.append({"rank": rank, "compute_us": _number(row.get("compute_time(us)")),
                      "non_compute_us": _number(row.get("non_compute_time(us)")),
                      "idle_us": _number(row.get("idle_time(us)")),
                      "kernel_us": _number(row.get("kernel_time(us)")),
                      "overlap_pct": shares.get(rank)})
    return {"error": None, "ranks": sorted(ranks, key=lambda r: r["rank"])}


def window_answer(docs: Iterable[RankEntry], root: str) -> HtaAnswer:
    """HTA's numbers for a window of ranks ``docs`` (their traces under ``root``), or why
    they are not given: the window holds no GPU kernels, or its traces are not here."""
    readable = [(d["rank"], d.get("path"), d["facts"]["kernels"])
                for d in docs if not d.get("error")]
    if not any(kernels for _rank, _path, kernels in readable):
        return {"error": "not run: the window holds no GPU kernels", "ranks": []}
    files = [os.path.join(root, str(path)) for _rank, path, _kernels in readable]
    gone = [rank for (rank, _p, _k), f in zip(readable, files, strict=True)
            if not os.path.isfile(f)]
    if gone:  # summarised by their ranks, and the traces not kept (or not copied here)
        return {"error": f"not run: the traces of rank(s) {rank_spans(gone)} are not "
                         "here (only their summaries)", "ranks": []}
    return run_hta(files)
