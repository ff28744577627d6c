"""The analysis of a run folder: every window chosen, every trace summed up in a process
pool, every window compared across its ranks.

:func:`analyze` returns the document ``policy-engine analyze --format json`` prints
(``schemas/analysis.schema.json`` describes it). Each trace is read by one worker, once,
as a stream; a worker hands back a summary of a few kilobytes, so memory per worker
stays bounded by one trace's merged intervals, whatever the number of ranks.
"""

from __future__ import annotations

import concurrent.futures
import os
import stat
from typing import Any

from policy_engine.analysis.chrome_trace import declared_size
from policy_engine.analysis.errors import AnalysisError
from policy_engine.analysis.format import size_cell
from policy_engine.analysis.manifests import Scan
from policy_engine.analysis.summary import summarize
from policy_engine.analysis.window import compare
from policy_engine.analysis.windows import describe, from_folders, from_manifests
from policy_engine.errors import did_you_mean

VERSION = 1


def _chosen(windows: list[dict[str, Any]], role: str | None, step: int | None,
            root: str) -> list[dict[str, Any]]:
    if role is not None:
        roles = sorted({w["role"] for w in windows})
        # Every window that holds the role: its family's name, or a role taking part
        # on one of its ranks (folders without manifests: the name's parts).
        windows = [w for w in windows if role == w["role"] or all(
            part in (w.get("holds") or w["role"].split("+")) for part in role.split("+"))]
        if not windows:
            raise AnalysisError(f"no role {role!r} under {root}: it holds "
                             f"{', '.join(roles) or 'no traces'}{did_you_mean(role, roles)}")
    if step is not None:
        every = windows
        windows = [w for w in windows if step in w["steps"]]
        if not windows:
            steps = sorted({s for w in every for s in w["steps"] if isinstance(s, int)})
            raise AnalysisError(f"no capture window covers step {step}; the steps captured are "
                             f"{', '.join(map(str, steps)) or 'none (whole sessions)'}")
    return windows


def summaries(files: list[str], jobs: int,
              limits: tuple[int, int] | None = None) -> list[dict[str, Any]]:
    """:func:`summarize` of every file, in order, over ``jobs`` worker processes;
    ``limits``: the most text read of one trace and of all of them (bytes)."""
    caps = allot(files, *limits) if limits else [None] * len(files)
    todo = [(f, cap) for f, cap in zip(files, caps, strict=True) if not isinstance(cap, str)]
    if jobs <= 1 or len(todo) <= 1:
        done = iter([_summarize(f, cap) for f, cap in todo])
    else:
        jobs = min(jobs, len(todo))
        # Small traces go to workers in batches: 4,096 ranks cost a few round trips each.
        chunk = max(1, min(64, len(todo) // (jobs * 4)))
        with concurrent.futures.ProcessPoolExecutor(max_workers=jobs) as pool:
            done = iter(list(pool.map(_summarize, *zip(*todo, strict=True), chunksize=chunk)))
    return [{"error": cap} if isinstance(cap, str) else next(done) for cap in caps]


def _summarize(path: str, cap: int | None) -> dict[str, Any]:
    return summarize(path, max_bytes=cap)


def allot(files: list[str], limit: int, total: int) -> list[int | str]:
    """What each trace may read (bytes of text) so that none reads more than ``limit``
    and all together no more than ``total``, in order, before any is read (they are read
    at once); or why one is not read. A trace's size is its gzip trailer's or the file's
    (a trailer that lies is stopped at what it said); a trace of unknown size may use
    what is left."""
    left = total
    caps: list[int | str] = []
    for path in files:
        size = _text_size(path)
        if size is not None and size > limit:
            caps.append(f"not read: it is {size_cell(size)} of text, over the "
                        f"{size_cell(limit)} read of one trace (--max-trace-mb)")
            continue
        need = min(limit, left) if size is None else size
        if need > left or left <= 0:
            caps.append(f"not read: the traces before it used up the {size_cell(total)} "
                        "read in all (--max-total-mb)")
            continue
        left -= need
        caps.append(need)
    return caps


def _text_size(path: str) -> int | None:
    """The text a trace holds: a plain file's size, a gzip's trailer (None where it
    cannot be trusted, or the file is not one to read: the reader says why)."""
    declared = declared_size(path)
    if declared is not None:
        return declared
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or os.pread(fd, 2, 0) == b"\x1f\x8b":
            return None
        return info.st_size
    except OSError:
        return None
    finally:
        os.close(fd)


def _expected(windows: list[dict[str, Any]]) -> dict[tuple[Any, Any], dict[str, set[int]]]:
    """Per role (family) and region, and per role of it, every rank that recorded (or
    tried to record) a window holding that role: a window without one of them that holds
    one of its roles is missing that rank. (verl's rollout, on rank 0 only, expects no
    other rank in a window of its own; a window of the actor expects every actor rank.)"""
    seen: dict[tuple[Any, Any], dict[str, set[int]]] = {}
    for w in windows:
        by_role = seen.setdefault((w["role"], w["region"]), {})
        holders = w.get("holders") or {}
        torch_failed = [d for d in w["dropped"] if d.get("backend") in (None, "torch")]
        for item in (*w["traces"], *w["skipped"], *torch_failed):
            rank = item.get("rank")
            if isinstance(rank, int):
                for role in holders.get(rank) or (w["role"],):
                    by_role.setdefault(role, set()).add(rank)
    return seen


def _wanted(expected: dict[tuple[Any, Any], dict[str, set[int]]],
            w: dict[str, Any]) -> set[int]:
    by_role = expected.get((w["role"], w["region"]), {})
    return set().union(*(by_role.get(role, set()) for role in w.get("holds") or (w["role"],)))


def analyze(root: str, *, role: str | None = None, step: int | None = None,
            jobs: int = 1, max_traces: int | None = None, from_traces: bool = False,
            scan: Scan | None = None, detail: bool = False,
            limits: tuple[int, int] | None = None) -> dict[str, Any]:
    """The analysis of every capture window under ``root`` that ``role`` and ``step``
    choose. AnalysisError when nothing is chosen. ``max_traces``: read whole windows, oldest
    first, while their traces fit in it (the first one always); the others say only why
    they exist, with ``not_analysed`` saying why not more. A trace whose rank summarised
    it (a ``summary`` line in its manifest) is not read, unless ``from_traces``: its
    figures are the summary's, and the trace need not be there. ``scan``: the manifests
    under ``root``, when the caller read them already; ``detail``: each rank keeps the
    operators of its summary (``ops``) and each window how it was recorded
    (``identity``), which the comparison of two runs reads; ``limits``: the most text
    read of one trace and of all (bytes), a trace past them reading as an error."""
    if not os.path.isdir(root):
        raise AnalysisError(f"{root} is not a folder")
    windows, problems, notes = from_manifests(root, from_traces=from_traces, scan=scan)
    manifests = bool(windows or problems)
    if not manifests:
        windows = from_folders(root)
    if not windows:
        raise AnalysisError(f"no traces under {root} (a policy-engine output folder has "
                         "manifests/*.manifest.jsonl; a torch.profiler folder has "
                         "*.pt.trace.json[.gz] files)")
    expected = _expected(windows)
    windows = _chosen(windows, role, step, root)
    left = max_traces
    for index, w in enumerate(windows):
        if left is not None and index and len(w["traces"]) > left:
            w["not_analysed"] = (f"not analysed here: over the {max_traces} traces read "
                                 "(policy-engine analyze DIR reads every window)")
            w["traces"], w["skipped"], left = [], [], 0
        elif left is not None:
            left -= len(w["traces"])
    files = [t["file"] for w in windows for t in w["traces"] if t.get("summary") is None]
    found = iter(summaries(files, jobs, limits))
    out = []
    for w in windows:
        ranks = []
        for index, t in enumerate(w["traces"]):
            summary = t.get("summary")
            if summary is None:
                summary = next(found)
            summary = dict(summary)  # the comparison adds to it
            rank = t["rank"]
            info = (summary.get("facts") or {}).get("distributed_info") or {}
            if rank is None:  # a folder without manifests: the trace says its rank
                rank = info.get("rank") if isinstance(info.get("rank"), int) else index
                w["world"] = w["world"] or info.get("world_size")
            if not detail:  # the comparison of two runs reads them; analyze shows none
                summary.pop("ops", None)
            ranks.append({"rank": rank, "path": t["path"], "status": t["status"], **summary})
        for s in w["skipped"]:
            ranks.append({"rank": s["rank"], "path": s["path"], "status": None,
                          "error": s["why"]})
        ranks.sort(key=lambda r: (not isinstance(r["rank"], int), r["rank"] or 0))
        want = _wanted(expected, w) if manifests else set()
        out.append({
            "title": describe(w),
            **{k: w[k] for k in ("role", "region", "steps", "cycle", "capture", "world",
                                 "why", "limits", "dropped", "other")},
            "ranks": ranks, **compare(w, ranks, want), "hta": None,
            **({"not_analysed": w["not_analysed"]} if "not_analysed" in w else {}),
            **({"identity": w.get("identity") or {}} if detail else {})})
    return {"version": VERSION, "root": os.path.abspath(root), "windows": out,
            "notes": notes, "problems": problems}
